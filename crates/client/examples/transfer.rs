//! Moves money between two `bank` accounts in one interactive transaction.
//!
//! ```sh
//! meridian cluster up --config cluster.toml          # a cluster with workload = "bank"
//! cargo run -p meridian-client --example transfer -- cluster.toml 1 5 250
//! ```
//!
//! Reads both balances in one round, writes both, commits; a conflict aborts the transaction
//! with nothing applied, and it runs again after a pause that grows with the aborts (two
//! clients retrying in lockstep could keep refusing each other under 2PL no-wait). An
//! overdraft is refused by the program itself (it aborts the transaction).

use meridian_client::{Client, Error, Key};

/// `bank` keeps account `n` under `table 3 ‖ n` and a balance as little-endian i64 cents.
fn account(n: u64) -> Key {
    Key::table(3).u64(n).build()
}

fn cents(value: Option<Vec<u8>>, n: u64) -> Result<i64, String> {
    let bytes = value.ok_or_else(|| format!("account {n} does not exist"))?;
    let bytes: [u8; 8] = bytes.try_into().map_err(|_| format!("account {n}: not a balance"))?;
    Ok(i64::from_le_bytes(bytes))
}

async fn transfer(client: &Client, from: u64, to: u64, amount: i64) -> Result<(), String> {
    for attempt in 1.. {
        let mut txn = client.begin().await.map_err(|e| e.to_string())?;
        let balances = match txn.get_many(&[account(from), account(to)]).await {
            Ok(balances) => balances,
            Err(e) if e.is_retryable() => {
                backoff(attempt).await;
                continue;
            }
            Err(e) => return Err(e.to_string()),
        };
        let mut balances = balances.into_iter();
        let a = cents(balances.next().flatten(), from)?;
        let b = cents(balances.next().flatten(), to)?;
        if a < amount {
            txn.abort().await.map_err(|e| e.to_string())?;
            return Err(format!("account {from} holds {a} cents, cannot pay {amount}"));
        }
        txn.put(account(from), (a - amount).to_le_bytes().to_vec()).map_err(|e| e.to_string())?;
        txn.put(account(to), (b + amount).to_le_bytes().to_vec()).map_err(|e| e.to_string())?;
        match txn.commit().await {
            Ok(ts) => {
                println!(
                    "moved {amount} cents from {from} ({a} -> {}) to {to} ({b} -> {}) at {:?}, attempt {attempt}",
                    a - amount,
                    b + amount,
                    ts.map(|t| t.0)
                );
                return Ok(());
            }
            Err(Error::Aborted(cause)) => {
                eprintln!("attempt {attempt} aborted ({}), again", cause.name());
                backoff(attempt).await;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    unreachable!("the loop returns")
}

/// Waits before the next attempt: 1 ms after the first abort, doubling up to 64 ms, plus a
/// part drawn from the clock so that two clients do not retry in step.
async fn backoff(attempt: u32) {
    let base_us = 1_000u64 << attempt.saturating_sub(1).min(6);
    let jitter_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_micros()) % base_us);
    tokio::time::sleep(std::time::Duration::from_micros(base_us + jitter_us)).await;
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match args.as_slice() {
        [file, from, to, amount] => match (from.parse(), to.parse(), amount.parse::<i64>()) {
            (Ok(from), Ok(to), Ok(amount)) if amount > 0 && from != to => {
                Some((file, from, to, amount))
            }
            _ => None,
        },
        _ => None,
    };
    let Some((file, from, to, amount)) = parsed else {
        eprintln!("usage: transfer CLUSTER.toml FROM TO CENTS (two different accounts, CENTS > 0)");
        return std::process::ExitCode::from(2);
    };
    let client = match Client::connect(file).await {
        Ok(client) => client,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let result = transfer(&client, from, to, amount).await;
    client.close().await;
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
