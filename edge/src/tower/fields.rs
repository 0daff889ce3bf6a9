//! Where the layer writes a granted response's RateLimit fields, whichever server's
//! response it is: [`Fields`], and `http` 1's header map as one.

use http::{HeaderMap, HeaderName, HeaderValue};

/// A response's headers, as the layer writes its fields into them.
pub(crate) trait Fields {
    /// Sets `name` to `value`, replacing what the response had.
    fn insert(&mut self, name: HeaderName, value: HeaderValue);
}

impl Fields for HeaderMap {
    fn insert(&mut self, name: HeaderName, value: HeaderValue) {
        HeaderMap::insert(self, name, value);
    }
}
