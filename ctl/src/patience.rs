//! Client changes that ride out a store failover: `blipless-ctl client add`,
//! `client set` and `client remove` repeat the very same change while the store is unavailable,
//! for up to [`STORE_PATIENCE`], so that an operator adding a client during a
//! Redis Sentinel or Cluster failover gets it stored once the new master is
//! elected instead of an error. Repeating is safe: adding the record that is
//! stored finishes that add (`Store::add_client`), and a repeated remove finds
//! nothing left to remove or finishes the feed entry it lacked, and a
//! repeated limits change finds its limits stored and appends the feed
//! entry a failed try may have lacked (`Store::update_limits`; without it
//! the planes would never pick the new limits up). A remove that
//! finds nothing after a failed try cannot tell "removed by that try" from
//! "never there", and says so ([`Removal::AbsentAfterRetry`]).

use std::time::Duration;

use blipless_store::{ClientLimits, ClientRecord, LimitsChange, Store, StoreError};

/// How long a client change is repeated while the store is unavailable.
pub const STORE_PATIENCE: Duration = Duration::from_secs(15);
/// The pause between two tries.
const PAUSE: Duration = Duration::from_millis(250);

/// Repeats `attempt` while it fails with `StoreError::Unavailable`, for up to
/// [`STORE_PATIENCE`], saying once on stderr that it waits. The flag says
/// whether the answer came from a repeat, after a try whose fate is unknown
/// (an unavailable store may have applied it before the connection failed).
async fn patiently<T, F, Fut>(what: &str, mut attempt: F) -> (Result<T, StoreError>, bool)
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
            other => return (other, said),
        }
    }
}

/// Adds `record`, repeating it while the store is unavailable.
pub async fn add_client(store: &dyn Store, record: &ClientRecord) -> Result<(), StoreError> {
    patiently("adding the client", || store.add_client(record.clone()))
        .await
        .0
}

/// Reads client `name`, repeating it while the store is unavailable.
pub async fn get_client(store: &dyn Store, name: &str) -> Result<Option<ClientRecord>, StoreError> {
    patiently("reading the client", || store.get_client(name))
        .await
        .0
}

/// Reads every client (`client add --wg` looks for a free address),
/// repeating it while the store is unavailable.
pub async fn read_clients(store: &dyn Store) -> Result<blipless_store::ClientList, StoreError> {
    patiently("reading the clients", || store.read_clients())
        .await
        .0
}

/// Changes client `name`'s limits by `change`, repeating it while the
/// store is unavailable.
pub async fn update_limits(
    store: &dyn Store,
    name: &str,
    change: LimitsChange,
) -> Result<ClientLimits, StoreError> {
    patiently("changing the client's limits", || {
        store.update_limits(name, change.clone())
    })
    .await
    .0
}

/// Resets client `name`'s quota count, repeating it while the store is
/// unavailable (a reset done twice is one reset).
pub async fn reset_quota_usage(store: &dyn Store, name: &str) -> Result<(), StoreError> {
    patiently("resetting the quota count", || {
        store.reset_quota_usage(name)
    })
    .await
    .0
}

/// What [`remove_client`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The client was there and this removal took it out.
    Removed,
    /// No client of that name was stored, on the first try.
    Absent,
    /// No client of that name was stored when a repeat asked, after a try
    /// the failing store may have carried out: the client is gone either way,
    /// but whether it ever existed is unknown.
    AbsentAfterRetry,
}

/// Removes client `name`, repeating it while the store is unavailable.
pub async fn remove_client(store: &dyn Store, name: &str) -> Result<Removal, StoreError> {
    let (result, repeated) = patiently("removing the client", || store.remove_client(name)).await;
    result.map(|removed| match (removed, repeated) {
        (true, _) => Removal::Removed,
        (false, false) => Removal::Absent,
        (false, true) => Removal::AbsentAfterRetry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(start_paused = true)]
    async fn a_repeat_says_that_an_earlier_try_may_have_landed() {
        let tries = AtomicUsize::new(0);
        let (result, repeated) = patiently("testing", || async {
            if tries.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(StoreError::Unavailable("failing over".into()))
            } else {
                Ok(false)
            }
        })
        .await;
        assert!(matches!(result, Ok(false)));
        assert!(repeated);
        assert_eq!(tries.load(Ordering::SeqCst), 2);

        let (result, repeated) =
            patiently("testing", || async { Ok::<_, StoreError>(false) }).await;
        assert!(matches!(result, Ok(false)));
        assert!(!repeated);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unavailable_store_is_given_up_on_after_the_patience() {
        let (result, repeated) = patiently("testing", || async {
            Err::<bool, _>(StoreError::Unavailable("down".into()))
        })
        .await;
        assert!(matches!(result, Err(StoreError::Unavailable(_))));
        assert!(repeated);
    }
}
