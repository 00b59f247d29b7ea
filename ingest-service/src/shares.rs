//! Each tenant's share of the requests in flight, so that one client
//! cannot take every slot of the pipeline's bound and starve the others.
//!
//! A request holds a [`Share`] of its tenant from the moment it is about to
//! be sent to the pipeline until it is answered (its commit, or an error).
//! A tenant that holds [`Shares::limit`] already is answered 429 with
//! `Retry-After`, and nothing of the request is taken. The limit is a
//! count, not a fraction of what is free: a tenant alone still gets no more
//! than its share, so that a second one arriving finds room.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::auth::Tenant;

/// The requests each tenant has in flight, and the limit per tenant.
#[derive(Debug)]
pub(crate) struct Shares {
    limit: usize,
    taken: Mutex<HashMap<Tenant, usize>>,
}

/// One request's place in its tenant's share; given back when dropped.
#[derive(Debug)]
pub(crate) struct Share {
    shares: Arc<Shares>,
    tenant: Tenant,
}

impl Shares {
    /// At most `limit` (at least 1) requests in flight per tenant.
    pub(crate) fn new(limit: usize) -> Arc<Shares> {
        Arc::new(Shares {
            limit: limit.max(1),
            taken: Mutex::new(HashMap::new()),
        })
    }

    /// The limit per tenant.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// A place in `tenant`'s share, or `None` when it holds the limit.
    pub(crate) fn try_take(self: &Arc<Self>, tenant: &Tenant) -> Option<Share> {
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let count = taken.entry(tenant.clone()).or_insert(0);
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(Share {
            shares: Arc::clone(self),
            tenant: tenant.clone(),
        })
    }

    #[cfg(test)]
    fn held(&self, tenant: &Tenant) -> usize {
        let taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        taken.get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut taken = self.shares.taken.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = taken.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                // Tenants that come and go leave nothing behind.
                taken.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_at_its_limit_is_refused_and_others_are_not() {
        let shares = Shares::new(2);
        let (greedy, polite) = (
            Tenant::new("greedy").unwrap(),
            Tenant::new("polite").unwrap(),
        );
        let first = shares.try_take(&greedy).unwrap();
        let _second = shares.try_take(&greedy).unwrap();
        assert!(shares.try_take(&greedy).is_none());
        let _other = shares.try_take(&polite).unwrap();
        drop(first);
        assert_eq!(shares.held(&greedy), 1);
        let _third = shares.try_take(&greedy).unwrap();
        assert!(shares.try_take(&greedy).is_none());
    }

    #[test]
    fn given_back_shares_leave_no_entry() {
        let shares = Shares::new(1);
        let tenant = Tenant::new("t").unwrap();
        drop(shares.try_take(&tenant).unwrap());
        assert!(shares.taken.lock().unwrap().is_empty());
        assert_eq!(Shares::new(0).limit(), 1);
    }
}
