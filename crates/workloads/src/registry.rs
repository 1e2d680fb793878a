//! The registry: the one place that maps a workload's name to its type ([`build`]). The
//! workloads depend on the contract in the crate root ([`crate::Workload`],
//! [`crate::WorkloadOptions`]); only this file depends on the workloads.

use crate::{bank, crossstitch, crossstitch_tpcc, elle, micro, retwis, scancount, smallbank};
use crate::{tiga, tpcc, ycsb, Workload, WorkloadOptions, WORKLOADS};
use meridian_core::error::unknown_name;
use meridian_core::ConfigError;

/// Builds a workload by name.
pub fn build(name: &str, options: &WorkloadOptions) -> Result<Box<dyn Workload>, ConfigError> {
    if options.distribution.is_some() && WORKLOADS.contains(&name) && !name.starts_with("ycsb-") {
        return Err(ConfigError::new(format!(
            "--distribution applies to the YCSB workloads, not {name}"
        )));
    }
    if options.region_groups.is_some()
        && WORKLOADS.contains(&name)
        && name != "crossstitch-synthetic"
    {
        return Err(ConfigError::new(format!(
            "--region-groups applies to crossstitch-synthetic, not {name}"
        )));
    }
    if options.tpcc != tpcc::TpccOptions::default() && WORKLOADS.contains(&name) && name != "tpcc" {
        return Err(ConfigError::new(format!(
            "the TPC-C settings (warehouses per shard, remote percentages, mode, scale) apply to tpcc, not {name}"
        )));
    }
    match name {
        "micro-luigi" => Ok(Box::new(micro::MicroLuigi::new(options)?)),
        "micro-tiga" => Ok(Box::new(tiga::MicroTiga::new(options)?)),
        "bank" => Ok(Box::new(bank::Bank::new(options)?)),
        "smallbank" => Ok(Box::new(smallbank::SmallBank::new(options)?)),
        "retwis" => Ok(Box::new(retwis::Retwis::new(options)?)),
        ycsb if ycsb.starts_with("ycsb-") && WORKLOADS.contains(&ycsb) => {
            Ok(Box::new(ycsb::Ycsb::new(ycsb, options)?))
        }
        "list-append" => Ok(Box::new(elle::ElleWorkload::new(elle::Kind::ListAppend, options)?)),
        "rw-register" => Ok(Box::new(elle::ElleWorkload::new(elle::Kind::RwRegister, options)?)),
        "tpcc" => Ok(Box::new(tpcc::Tpcc::new(options)?)),
        "scan-count" => Ok(Box::new(scancount::ScanCount::new(options)?)),
        "crossstitch-synthetic" => Ok(Box::new(crossstitch::Synthetic::new(options)?)),
        "crossstitch-order-status" => Ok(Box::new(crossstitch_tpcc::CrossStitchTpcc::new(
            crossstitch_tpcc::Kind::OrderStatus,
            options,
        )?)),
        "crossstitch-stock-level" => Ok(Box::new(crossstitch_tpcc::CrossStitchTpcc::new(
            crossstitch_tpcc::Kind::StockLevel,
            options,
        )?)),
        other => Err(unknown_name("workload", other, &WORKLOADS)),
    }
}
