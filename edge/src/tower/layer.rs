//! The layer: [`RateLimitLayer`], built by [`RateLimitLayerBuilder`] from its rules
//! and settings, and how it picks its responder and wraps a service.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redlimit_runtime::Client;
use tower_layer::Layer;

use super::respond::{Grpc, PlainText, ProblemDetails};
use super::rule::LayerRule;
use super::service::RateLimit;
use super::shared::{Settings, Shared};
use super::validate::InvalidLayer;
use crate::TrustedProxies;

/// Builds a [`RateLimitLayer`].
#[derive(Debug, Default)]
pub struct RateLimitLayerBuilder {
    rules: Vec<LayerRule>,
    client: Option<Client>,
    trusted: Option<TrustedProxies>,
    timeout: Option<Duration>,
    no_success_fields: bool,
    x_ratelimit: bool,
    #[cfg(any(feature = "axum", feature = "actix"))]
    problem_type: redlimit_runtime::ProblemType,
}

impl RateLimitLayerBuilder {
    /// Adds a rule; every rule is decided on each request, all or nothing.
    pub fn rule(mut self, rule: LayerRule) -> Self {
        self.rules.push(rule);
        self
    }

    /// The client deciding the rules (default: redlimit's default client, from
    /// `REDIS_URL` or in process, resolved on the first request).
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// The proxies whose forwarding header [`Key::client_ip`](super::Key::client_ip)
    /// believes (else a `TrustedProxies` request extension; else none). The layer
    /// leaves the setting it read on each request: the handler's
    /// [`ClientIp`](crate::ClientIp) is the client it keyed by. Two different settings
    /// on one request are refused as misconfigured (500): by the layer when it sees
    /// both (an extension outside it, another layer's), by `ClientIp` when the
    /// extension is inside the layer.
    pub fn trusted_proxies(mut self, trusted: TrustedProxies) -> Self {
        self.trusted = Some(trusted);
        self
    }

    /// Wait up to `timeout` for permits before refusing (default: refuse at once).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Whether granted responses carry `RateLimit-Policy` and `RateLimit` for the rule
    /// with the fewest permits left (default true).
    pub fn success_fields(mut self, on: bool) -> Self {
        self.no_success_fields = !on;
        self
    }

    /// Also adds `X-RateLimit-Limit` and `X-RateLimit-Remaining` to granted responses
    /// (with the success fields' rule), and `X-RateLimit-Limit`, `X-RateLimit-Remaining:
    /// 0` and `X-RateLimit-Reset` (seconds, as `Retry-After`) to 429s, beside the IETF
    /// fields, for clients that read those (default false).
    pub fn x_ratelimit_headers(mut self, on: bool) -> Self {
        self.x_ratelimit = on;
        self
    }

    /// The problem type of a 429 answered as problem+json (by
    /// [`problem_json`](RateLimitLayer::problem_json), or a responder of your own that
    /// renders `ProblemJson`): the registered quota-exceeded type naming the refusing
    /// rule in `violated-policies` (the default), or `about:blank`.
    #[cfg(any(feature = "axum", feature = "actix"))]
    pub fn problem_type(mut self, problem_type: redlimit_runtime::ProblemType) -> Self {
        self.problem_type = problem_type;
        self
    }

    /// Adds every rule of `rules`, in order (rules read from configuration).
    pub fn rules(mut self, rules: impl IntoIterator<Item = LayerRule>) -> Self {
        self.rules.extend(rules);
        self
    }

    /// Checks the rules: at least one and at most
    /// [`MAX_RULES_PER_CALL`](redlimit_runtime::MAX_RULES_PER_CALL); distinct names, not empty; rate, interval and
    /// permits as a limiter accepts them; header names valid; no empty exempt value.
    pub fn build(self) -> Result<RateLimitLayer, InvalidLayer> {
        if self.rules.is_empty() {
            return Err(InvalidLayer(
                "a RateLimitLayer needs at least one rule: add one with .rule(LayerRule::new(name, rate, interval))".into(),
            ));
        }
        let most = redlimit_runtime::MAX_RULES_PER_CALL;
        if self.rules.len() > most {
            return Err(InvalidLayer(format!(
                "a RateLimitLayer of {} rules: a request's rules are decided in one call, of at most {most} \
                 rules; keep each layer to {most} rules at most",
                self.rules.len()
            )));
        }
        if let Some(client) = &self.client {
            // The limiters are `<prefix><name>` and `<prefix><name>:<escaped value>`:
            // a prefix with a stray brace would refuse every request.
            for rule in &self.rules {
                let name = format!("{}{}", client.prefix(), rule.name());
                if let Err(error) = redlimit_runtime::keys::check_name(&name) {
                    return Err(InvalidLayer(format!(
                        "rule `{}`: with the client's key prefix `{}`: {error}",
                        rule.name(),
                        client.prefix()
                    )));
                }
            }
        }
        let settings = Settings {
            client: self.client,
            trusted: self.trusted,
            timeout: self.timeout,
            success_fields: !self.no_success_fields,
            x_ratelimit: self.x_ratelimit,
            #[cfg(any(feature = "axum", feature = "actix"))]
            problem_type: self.problem_type,
        };
        Ok(RateLimitLayer {
            shared: Arc::new(Shared::new(self.rules, settings)?),
            respond: PlainText,
        })
    }
}

/// Rate-limits every request through it (see the module's docs). Cheap to clone:
/// clones share the rules' state.
#[derive(Clone)]
pub struct RateLimitLayer<R = PlainText> {
    pub(crate) shared: Arc<Shared>,
    pub(crate) respond: R,
}

impl RateLimitLayer {
    /// A layer's rules and settings.
    pub fn builder() -> RateLimitLayerBuilder {
        RateLimitLayerBuilder::default()
    }
}

impl<R> RateLimitLayer<R> {
    /// Refusals as `application/problem+json`.
    pub fn problem_json(self) -> RateLimitLayer<ProblemDetails> {
        RateLimitLayer {
            shared: self.shared,
            respond: ProblemDetails,
        }
    }

    /// Refusals as gRPC statuses, for `tonic::transport::Server::layer`.
    pub fn grpc(self) -> RateLimitLayer<Grpc> {
        RateLimitLayer {
            shared: self.shared,
            respond: Grpc,
        }
    }

    /// Refusals made by your own [`Respond`](super::Respond).
    pub fn respond_with<T>(self, respond: T) -> RateLimitLayer<T> {
        RateLimitLayer {
            shared: self.shared,
            respond,
        }
    }
}

impl<R> fmt::Debug for RateLimitLayer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rules", &self.shared.engine.rules())
            .finish_non_exhaustive()
    }
}

impl<S, R: Clone> Layer<S> for RateLimitLayer<R> {
    type Service = RateLimit<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: self.shared.clone(),
            respond: self.respond.clone(),
        }
    }
}
