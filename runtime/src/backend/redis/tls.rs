//! TLS for `rediss://` (cargo feature `tls`): rustls with the system's roots by
//! default, or a CA and client certificate given to the builder.

use redis::{ClientTlsConfig, TlsCertificates};

/// PEM files given to [`ClientBuilder`](crate::ClientBuilder).
#[derive(Clone, Default)]
pub(crate) struct TlsFiles {
    pub ca: Option<Vec<u8>>,
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    /// redis-rs's certificates, when any were given.
    pub fn certificates(&self) -> Option<TlsCertificates> {
        if self.ca.is_none() && self.client.is_none() {
            return None;
        }
        Some(TlsCertificates {
            client_tls: self
                .client
                .clone()
                .map(|(client_cert, client_key)| ClientTlsConfig {
                    client_cert,
                    client_key,
                }),
            root_cert: self.ca.clone(),
        })
    }
}

/// rustls needs a process-wide crypto provider: install ring's unless the application
/// installed one.
pub(crate) fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
