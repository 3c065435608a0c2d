//! What the IP scope layer and its services share. Apart from the layer,
//! which makes the services, so that the services and their futures use it
//! without using the layer back.

use std::sync::Arc;

use super::cache::DnsCache;
use crate::registry::Registry;

/// What every clone of the layer and its services share.
pub(crate) struct IpShared {
    pub(crate) registry: Registry,
    pub(crate) cache: Arc<DnsCache>,
}
