//! Client changes that ride out a store failover: `blipless-ctl client add` and
//! `client remove` repeat the very same change while the store is unavailable,
//! for up to [`STORE_PATIENCE`], so that an operator adding a client during a
//! Redis Sentinel or Cluster failover gets it stored once the new master is
//! elected instead of an error. Repeating is safe: adding the record that is
//! stored finishes that add (`Store::add_client`), and a repeated remove finds
//! nothing left to remove or finishes the feed entry it lacked.

use std::time::Duration;

use blipless_store::{ClientRecord, Store, StoreError};

/// How long a client change is repeated while the store is unavailable.
pub const STORE_PATIENCE: Duration = Duration::from_secs(15);
/// The pause between two tries.
const PAUSE: Duration = Duration::from_millis(250);

/// Repeats `attempt` while it fails with `StoreError::Unavailable`, for up to
/// [`STORE_PATIENCE`], saying once on stderr that it waits.
async fn patiently<T, F, Fut>(what: &str, mut attempt: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let deadline = tokio::time::Instant::now() + STORE_PATIENCE;
    let mut said = false;
    loop {
        match attempt().await {
            Err(StoreError::Unavailable(detail)) if tokio::time::Instant::now() < deadline => {
                if !said {
                    eprintln!(
                        "blipless-ctl: {what}: the store is unavailable ({detail}); \
                         trying again for up to {} s",
                        STORE_PATIENCE.as_secs()
                    );
                    said = true;
                }
                tokio::time::sleep(PAUSE).await;
            }
            other => return other,
        }
    }
}

/// Adds `record`, repeating it while the store is unavailable.
pub async fn add_client(store: &dyn Store, record: &ClientRecord) -> Result<(), StoreError> {
    patiently("adding the client", || store.add_client(record.clone())).await
}

/// Removes client `name`, repeating it while the store is unavailable.
pub async fn remove_client(store: &dyn Store, name: &str) -> Result<bool, StoreError> {
    patiently("removing the client", || store.remove_client(name)).await
}
