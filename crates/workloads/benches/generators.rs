//! Key generators per second (target: scrambled Zipfian ≥ 10M keys/s per core).
//! `cargo bench -p meridian-workloads --bench generators`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use meridian_core::rng::child_rng;
use meridian_workloads::dist::Zipf;
use meridian_workloads::ycsb_gen::{Hotspot, ScrambledZipfian, Zipfian};
use std::hint::black_box;

const BATCH: u64 = 1_000;

fn generators(c: &mut Criterion) {
    let mut group = c.benchmark_group("generators");
    group.throughput(Throughput::Elements(BATCH));
    let mut rng = child_rng(1, "bench", 0);
    let mut scrambled = ScrambledZipfian::new(0, 10_000_000).expect("valid");
    group.bench_function("scrambled_zipfian_10M_keys", |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                black_box(scrambled.next(&mut rng));
            }
        })
    });
    let mut zipfian = Zipfian::new(0, 1_000_000, 0.99).expect("valid");
    group.bench_function("zipfian_1M_keys", |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                black_box(zipfian.next(&mut rng));
            }
        })
    });
    let hotspot = Hotspot::new(0, 9_999_999, 0.2, 0.8).expect("valid");
    group.bench_function("hotspot_10M_keys", |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                black_box(hotspot.next(&mut rng));
            }
        })
    });
    let zipf = Zipf::new(1_000_000, 0.99).expect("valid");
    group.bench_function("micro_zipf_1M_keys", |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                black_box(zipf.sample(&mut rng));
            }
        })
    });
    group.finish();
}

criterion_group!(benches, generators);
criterion_main!(benches);
