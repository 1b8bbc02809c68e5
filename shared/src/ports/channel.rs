//! The `ReleaseChannels` trait: which k3s release a channel names, as k3s's channel server
//! (rancher/channelserver) answers it. The real implementation is
//! [`crate::adapters::k3s_channel::HttpChannels`]; tests point it at the simulator's channel
//! server.

use futures::future::BoxFuture;

/// Why a channel gave no release. Messages never contain secrets (the request carries none).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// No answer (connection refused, DNS, TLS, timeout).
    #[error("no answer from {url}: {message}")]
    Unreachable { url: String, message: String },
    /// An answer that is not the redirect to a release (404 for a channel the server does not
    /// have, a 5xx, a 200 without a redirect).
    #[error("{url} answered HTTP {status} instead of a redirect to the channel's release")]
    Status { url: String, status: u16 },
    /// The redirect has no usable `Location`.
    #[error("{url} redirected to {location:?}, which names no release")]
    Location { url: String, location: String },
}

/// The channel server, asked once per question (no retries: a run asks at most once).
pub trait ReleaseChannels: Send + Sync {
    /// The release `channel` names at the channel server `base` (`<base>/<channel>`).
    fn latest<'a>(
        &'a self,
        base: &'a str,
        channel: &'a str,
    ) -> BoxFuture<'a, Result<String, ChannelError>>;
}
