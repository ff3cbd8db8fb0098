//! How a coordinator and its workers reach each other: [`Workers`], the configured
//! workers that answered lately (datafusion-distributed's `WorkerResolver`), and
//! [`LoginChannels`], gRPC channels to workers whose every call carries the login
//! (its `ChannelResolver`, for the coordinator and for workers reading each other's
//! stages), whose answers carrying stage output are checked before they are decoded
//! (`answers`).
//!
//! A call that cannot reach its worker, or whose answer breaks off (the worker died),
//! fails with `UNAVAILABLE` naming the worker, and the worker is left out of the queries
//! planned after it until it answers a probe again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::error::{DataFusionError, Result};
use datafusion_distributed::{
    BoxCloneSyncChannel, ChannelResolver, GetWorkerInfoRequest, WorkerResolver,
    WorkerServiceClient, create_worker_client,
};
use http::HeaderValue;
use http_body_util::BodyExt;
use mink_auth::Credentials;
use tonic::Status;
use tonic::body::Body;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tower::ServiceBuilder;
use url::Url;

use super::answers::CheckedAnswers;

/// How often the configured workers are asked whether they are up.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// How long a worker has to answer a probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Channels to workers, each call with the login (see the module docs).
#[derive(Clone)]
pub struct LoginChannels {
    /// One channel per worker, connected on its first call.
    channels: Arc<Mutex<HashMap<Url, Channel>>>,
    authorization: Option<HeaderValue>,
    /// TLS of every channel, when the workers serve it.
    tls: Option<ClientTlsConfig>,
    unreachable: Unreachable,
}

impl std::fmt::Debug for LoginChannels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginChannels")
            .field("login", &self.authorization.is_some())
            .finish_non_exhaustive()
    }
}

impl LoginChannels {
    /// Channels whose calls log in with `credentials` (none: calls carry no login),
    /// over TLS with `tls` (the workers' certificates checked as it says).
    ///
    /// # Errors
    /// The user or password does not fit in a header.
    pub fn new(credentials: Option<&Credentials>, tls: Option<ClientTlsConfig>) -> Result<Self> {
        let authorization = credentials
            .map(|credentials| {
                let basic = mink_auth::basic_header(credentials)
                    .map_err(|status| DataFusionError::Configuration(status.message().into()))?;
                HeaderValue::from_bytes(basic.as_encoded_bytes())
                    .map_err(|e| DataFusionError::Configuration(e.to_string()))
            })
            .transpose()?;
        Ok(Self {
            channels: Arc::default(),
            authorization,
            tls,
            unreachable: Unreachable::default(),
        })
    }

    /// The channel to `worker`, made on first use; it connects on its first call, so a
    /// worker that is down fails the call (see [`Unreachable::naming`]).
    fn channel(&self, worker: &Url) -> Result<Channel> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(channel) = channels.get(worker) {
            return Ok(channel.clone());
        }
        let invalid = |e: tonic::transport::Error| {
            DataFusionError::Configuration(format!("worker address '{worker}': {e}"))
        };
        let mut endpoint = Endpoint::from_shared(worker.to_string())
            .map_err(invalid)?
            .max_frame_size(mink_auth::CLIENT_MAX_FRAME_BYTES);
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone()).map_err(invalid)?;
        }
        if channels.len() >= MAX_WORKERS {
            channels.clear();
        }
        let channel = endpoint.connect_lazy();
        channels.insert(worker.clone(), channel.clone());
        Ok(channel)
    }
}

/// The most workers a process holds channels to, or remembers failures of, at once: the
/// workers' addresses of a plan come from its coordinator, and a plan naming far more
/// than a cluster has must not grow either without bound.
const MAX_WORKERS: usize = 4096;

#[async_trait]
impl ChannelResolver for LoginChannels {
    async fn get_worker_client_for_url(
        &self,
        url: &Url,
    ) -> Result<WorkerServiceClient<BoxCloneSyncChannel>> {
        let channel = self.channel(url)?;
        let authorization = self.authorization.clone();
        let (worker, unreachable) = (url.clone(), self.unreachable.clone());
        let channel = ServiceBuilder::new()
            .map_request(move |mut request: http::Request<Body>| {
                if let Some(authorization) = &authorization {
                    let headers = request.headers_mut();
                    headers.insert(http::header::AUTHORIZATION, authorization.clone());
                }
                request
            })
            .map_result(move |answer| Ok(unreachable.naming(&worker, answer)))
            .service(channel);
        // Outside the naming: a refused answer fails its stage, the worker stays live.
        let channel = CheckedAnswers::new(channel);
        Ok(create_worker_client(BoxCloneSyncChannel::new(channel)))
    }
}

/// What the message of a call to a worker that cannot be reached or was lost starts with.
const WORKER_UNAVAILABLE: &str = "SQL worker unavailable: ";

/// The status of a call to `worker` that failed with `error`, as `what` says.
fn unavailable(worker: &Url, what: &str, error: &dyn std::fmt::Display) -> Status {
    Status::unavailable(format!("{WORKER_UNAVAILABLE}{worker} {what}: {error}"))
}

/// Whether `error` is, or was caused by, a worker that could not be reached or was lost
/// during the statement (whichever way datafusion-distributed relayed it: a worker's
/// status, or the text of a plan that could not be sent): the statement may succeed
/// once the worker is left out.
pub fn is_worker_unavailable(error: &DataFusionError) -> bool {
    error.to_string().contains(WORKER_UNAVAILABLE)
}

/// The workers calls failed to reach, each with when it last failed: left out of the
/// queries planned until a probe sent after that answers.
#[derive(Debug, Clone, Default)]
struct Unreachable(Arc<Mutex<HashMap<Url, Instant>>>);

impl Unreachable {
    /// `worker`'s answer, its body's failure (the worker died while answering) turned
    /// into `UNAVAILABLE` naming it; or, when it could not be reached, an answer of that
    /// status. Either failure marks the worker unreachable.
    fn naming(
        &self,
        worker: &Url,
        answer: Result<http::Response<Body>, tonic::transport::Error>,
    ) -> http::Response<Body> {
        let response = match answer {
            Ok(response) => response,
            Err(error) => {
                self.mark(worker);
                return unavailable(worker, "cannot be reached", &error).into_http();
            }
        };
        let (worker, unreachable) = (worker.clone(), self.clone());
        response.map(|body| {
            Body::new(body.map_err(move |error| {
                unreachable.mark(&worker);
                unavailable(&worker, "was lost", &error)
            }))
        })
    }

    fn mark(&self, worker: &Url) {
        let mut failed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if failed.len() >= MAX_WORKERS && !failed.contains_key(worker) {
            failed.clear();
        }
        failed.insert(worker.clone(), Instant::now());
    }

    /// `worker` answered a probe sent at `asked`: failures before it are forgotten.
    fn answered(&self, worker: &Url, asked: Instant) {
        let mut failed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if failed.get(worker).is_some_and(|&at| at < asked) {
            failed.remove(worker);
        }
    }

    fn contains(&self, worker: &Url) -> bool {
        let failed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        failed.contains_key(worker)
    }
}

/// The configured workers, and which of them answered their last probe: a query is
/// planned over those only, so a worker that is down is left out of the next query and
/// one that comes up joins it within [`PROBE_INTERVAL`].
#[derive(Debug, Clone)]
pub struct Workers {
    configured: Arc<[Url]>,
    live: Arc<RwLock<Vec<Url>>>,
    unreachable: Unreachable,
}

impl Workers {
    /// `configured` (`http://HOST:PORT` each), probed with `channels` every
    /// [`PROBE_INTERVAL`] on the current tokio runtime for as long as the returned value
    /// or a clone of it lives.
    pub fn probed(configured: Vec<Url>, channels: LoginChannels) -> Self {
        let workers = Self {
            configured: configured.into(),
            live: Arc::default(),
            unreachable: channels.unreachable.clone(),
        };
        let weak = Arc::downgrade(&workers.live);
        let configured = Arc::clone(&workers.configured);
        tokio::spawn(async move {
            loop {
                let mut live = Vec::new();
                for url in configured.iter() {
                    let asked = Instant::now();
                    if answers(&channels, url).await {
                        channels.unreachable.answered(url, asked);
                        live.push(url.clone());
                    }
                }
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                *shared.write().unwrap_or_else(PoisonError::into_inner) = live;
                drop(shared);
                tokio::time::sleep(PROBE_INTERVAL).await;
            }
        });
        workers
    }

    /// The workers configured, up or not.
    pub fn configured(&self) -> &[Url] {
        &self.configured
    }

    /// The workers that answered their last probe and no call failed to reach since.
    pub fn live(&self) -> Vec<Url> {
        let mut live = self
            .live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        live.retain(|worker| !self.unreachable.contains(worker));
        live
    }
}

impl WorkerResolver for Workers {
    fn get_urls(&self) -> Result<Vec<Url>> {
        Ok(self.live())
    }
}

/// Whether the worker at `url` answers (and accepts the login) within
/// [`PROBE_TIMEOUT`].
async fn answers(channels: &LoginChannels, url: &Url) -> bool {
    let probe = async {
        let mut client = channels.get_worker_client_for_url(url).await.ok()?;
        client.get_worker_info(GetWorkerInfoRequest {}).await.ok()
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, probe).await,
        Ok(Some(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A URL of a loopback port nothing listens on.
    fn closed_port() -> Url {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        drop(listener);
        Url::parse(&format!("http://{addr}")).expect("url")
    }

    #[tokio::test]
    async fn a_worker_that_cannot_be_reached_is_named_and_marked() {
        let channels = LoginChannels::new(None, None).expect("channels");
        let url = closed_port();
        let mut client = channels
            .get_worker_client_for_url(&url)
            .await
            .expect("client");
        let status = client
            .get_worker_info(GetWorkerInfoRequest {})
            .await
            .expect_err("a closed port answered");
        let error = DataFusionError::External(Box::new(status));
        assert!(is_worker_unavailable(&error), "{error}");
        assert!(error.to_string().contains(url.as_str()), "{error}");
        assert!(channels.unreachable.contains(&url));
        channels.unreachable.answered(&url, Instant::now());
        assert!(
            !channels.unreachable.contains(&url),
            "a later probe answered"
        );
    }

    #[test]
    fn failures_are_remembered_for_a_bounded_number_of_workers() {
        let unreachable = Unreachable::default();
        for port in 0..MAX_WORKERS + 10 {
            let worker = Url::parse(&format!("http://10.0.0.1:{port}")).expect("url");
            unreachable.mark(&worker);
        }
        let remembered = unreachable.0.lock().expect("lock").len();
        assert!(
            remembered <= MAX_WORKERS,
            "{remembered} failures remembered"
        );
    }
}
