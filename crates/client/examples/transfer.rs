//! Moves money between two `bank` accounts in one interactive transaction.
//!
//! ```sh
//! meridian cluster up --config cluster.toml          # a cluster with workload = "bank"
//! cargo run -p meridian-client --example transfer -- cluster.toml 1 5 250
//! ```
//!
//! Reads both balances in one round, writes both, commits, through [`Client::transact`]: a
//! conflict aborts the transaction with nothing applied, and the helper runs it again after a
//! pause that grows with the aborts (two clients retrying in lockstep could keep refusing
//! each other under 2PL no-wait). An overdraft is refused by the program itself: its error is
//! not retryable, so the transaction is aborted and the helper returns it.

use meridian_client::{Client, Error, Key};

/// `bank` keeps account `n` under `table 3 ‖ n` and a balance as little-endian i64 cents.
fn account(n: u64) -> Key {
    Key::table(3).u64(n).build()
}

fn cents(value: Option<Vec<u8>>, n: u64) -> Result<i64, Error> {
    let bytes = value.ok_or_else(|| Error::Failed(format!("account {n} does not exist")))?;
    let bytes: [u8; 8] =
        bytes.try_into().map_err(|_| Error::Failed(format!("account {n}: not a balance")))?;
    Ok(i64::from_le_bytes(bytes))
}

async fn transfer(client: &Client, from: u64, to: u64, amount: i64) -> Result<(), Error> {
    let (a, b) = client
        .transact(|txn| {
            Box::pin(async move {
                let balances = txn.get_many(&[account(from), account(to)]).await?;
                let mut balances = balances.into_iter();
                let a = cents(balances.next().flatten(), from)?;
                let b = cents(balances.next().flatten(), to)?;
                if a < amount {
                    return Err(Error::Failed(format!(
                        "account {from} holds {a} cents, cannot pay {amount}"
                    )));
                }
                txn.put(account(from), (a - amount).to_le_bytes().to_vec())?;
                txn.put(account(to), (b + amount).to_le_bytes().to_vec())?;
                Ok((a, b))
            })
        })
        .await?;
    println!(
        "moved {amount} cents from {from} ({a} -> {}) to {to} ({b} -> {})",
        a - amount,
        b + amount
    );
    Ok(())
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
