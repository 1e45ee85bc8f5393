//! The payment service of the gRPC example and tests, `payments.Payments`:
//! unary `Pay` and server-streaming `Watch`, behind the idempotency layer,
//! counting how often `Pay`'s handler really ran. Written by hand over
//! tonic's generic server and client with prost messages, as tonic's code
//! generator would write it, so no `.proto` compiler is needed.
//!
//! The request steers the handler, so one server serves every case:
//! `amount_cents` pays; `delay_ms` makes it slow (a duplicate arrives
//! while it runs); `fail_with` answers that status code instead (with
//! trailing metadata); `response_bytes` pads the answer; `panic` makes the
//! handler panic; `block_ms` blocks its thread that long (synchronous work
//! that never yields); `charge_step` charges the card in a recorded step
//! (from the request's extensions), and with `fail_first_after_charge` the
//! handler's first run answers `UNAVAILABLE` after it (nothing kept: the
//! retry replays the charge, not runs it). A guarded `Pay` answers its lease's fence in
//! `x-fence` metadata (from the request's extensions: what an outside
//! write would carry).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use idem::grpc::IdempotencyLayer;
use idem::lease::{LeaseInfo, Steps};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::codegen::tokio_stream::{self, Stream};
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;

/// What a client sends to `Pay`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PayRequest {
    #[prost(int64, tag = "1")]
    pub amount_cents: i64,
    #[prost(uint64, tag = "2")]
    pub delay_ms: u64,
    /// A gRPC status code to answer instead of paying (0: pay).
    #[prost(int32, tag = "3")]
    pub fail_with: i32,
    #[prost(uint64, tag = "4")]
    pub response_bytes: u64,
    #[prost(bool, tag = "5")]
    pub panic: bool,
    /// Free text (a long one makes a long request).
    #[prost(string, tag = "6")]
    pub memo: String,
    #[prost(uint64, tag = "7")]
    pub block_ms: u64,
    #[prost(bool, tag = "8")]
    pub charge_step: bool,
    #[prost(bool, tag = "9")]
    pub fail_first_after_charge: bool,
}

/// What `Pay` answers (and `Watch` streams).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Payment {
    #[prost(uint64, tag = "1")]
    pub payment_id: u64,
    #[prost(int64, tag = "2")]
    pub amount_cents: i64,
    #[prost(string, tag = "3")]
    pub padding: String,
}

/// The service's name, and its methods' paths.
pub const SERVICE: &str = "payments.Payments";
pub const PAY: &str = "/payments.Payments/Pay";
pub const WATCH: &str = "/payments.Payments/Watch";

/// The shop's state: how many payments `Pay` made, and how many times a
/// card was charged.
#[derive(Clone, Debug, Default)]
pub struct Shop {
    runs: Arc<AtomicU64>,
    charges: Arc<AtomicU64>,
}

impl Shop {
    /// Times `Pay`'s handler ran.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }

    /// Times a card was charged (the card network does not deduplicate).
    pub fn charges(&self) -> u64 {
        self.charges.load(Ordering::SeqCst)
    }

    async fn pay(&self, request: Request<PayRequest>) -> Result<Response<Payment>, Status> {
        let fence = request.extensions().get::<LeaseInfo>().map(|lease| lease.fence);
        let steps = request.extensions().get::<Steps<'static>>().cloned();
        let request = request.into_inner();
        let payment_id = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let mut replayed_steps = None;
        if request.charge_step {
            let steps = steps.ok_or_else(|| Status::internal("no step log: is the method guarded?"))?;
            let charges = self.charges.clone();
            steps
                .run("charge", |_key| async move {
                    charges.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, idem::Error>(())
                })
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            replayed_steps = Some(steps.recorded() as u64);
            if request.fail_first_after_charge && payment_id == 1 {
                return Err(Status::unavailable("the ledger was down after the charge"));
            }
        }
        if request.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(request.delay_ms)).await;
        }
        if request.block_ms > 0 {
            std::thread::sleep(Duration::from_millis(request.block_ms));
        }
        if request.panic {
            panic!("the payment handler panicked (asked to, by the request)");
        }
        if request.fail_with != 0 {
            let mut status = Status::new(Code::from_i32(request.fail_with), format!("payment {payment_id} failed"));
            status.metadata_mut().insert("x-failed-payment", MetadataValue::from(payment_id));
            return Err(status);
        }
        let padding = "x".repeat(usize::try_from(request.response_bytes).unwrap_or(0));
        let mut response = Response::new(Payment { payment_id, amount_cents: request.amount_cents, padding });
        response.metadata_mut().insert("x-payment-id", MetadataValue::from(payment_id));
        response.metadata_mut().append("x-audit", MetadataValue::from_static("first"));
        response.metadata_mut().append("x-audit", MetadataValue::from_static("second"));
        if let Some(fence) = fence {
            response.metadata_mut().insert("x-fence", MetadataValue::from(fence));
        }
        if let Some(replayed) = replayed_steps {
            response.metadata_mut().insert("x-steps-replayed", MetadataValue::from(replayed));
        }
        Ok(response)
    }
}

/// The server side of `payments.Payments`, as generated code would route it.
#[derive(Clone, Debug, Default)]
pub struct PaymentsServer {
    shop: Shop,
}

impl PaymentsServer {
    pub fn new(shop: Shop) -> PaymentsServer {
        PaymentsServer { shop }
    }
}

impl tonic::server::NamedService for PaymentsServer {
    const NAME: &'static str = SERVICE;
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

struct PaySvc(Shop);

impl tonic::server::UnaryService<PayRequest> for PaySvc {
    type Response = Payment;
    type Future = BoxFuture<Response<Payment>, Status>;

    fn call(&mut self, request: Request<PayRequest>) -> Self::Future {
        let shop = self.0.clone();
        Box::pin(async move { shop.pay(request).await })
    }
}

struct WatchSvc;

/// `Watch` streams three payments, a moment apart.
impl tonic::server::ServerStreamingService<PayRequest> for WatchSvc {
    type Response = Payment;
    type ResponseStream = Pin<Box<dyn Stream<Item = Result<Payment, Status>> + Send>>;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: Request<PayRequest>) -> Self::Future {
        let amount_cents = request.into_inner().amount_cents;
        let payments = (1..=3).map(move |payment_id| Ok(Payment { payment_id, amount_cents, padding: String::new() }));
        let stream = tokio_stream::StreamExt::throttle(tokio_stream::iter(payments), Duration::from_millis(20));
        Box::pin(async move { Ok(Response::new(Box::pin(stream) as Self::ResponseStream)) })
    }
}

impl tower_service::Service<http::Request<Body>> for PaymentsServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<http::Response<Body>, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let shop = self.shop.clone();
        match request.uri().path() {
            PAY => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::<Payment, PayRequest>::default());
                Ok(grpc.unary(PaySvc(shop), request).await)
            }),
            WATCH => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::<Payment, PayRequest>::default());
                Ok(grpc.server_streaming(WatchSvc, request).await)
            }),
            _ => Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// Serve `payments.Payments` over `shop` behind `layer` on a free loopback
/// port; its address.
pub async fn serve(shop: Shop, layer: IdempotencyLayer) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let addr = listener.local_addr().expect("an address");
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(PaymentsServer::new(shop))
            .serve_with_incoming(incoming)
            .await
            .expect("the server runs");
    });
    addr
}

/// A client of `payments.Payments`, as generated code would write it.
#[derive(Clone, Debug)]
pub struct PaymentsClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl PaymentsClient {
    /// A client on one HTTP/2 connection to `addr` (every call multiplexed
    /// on it).
    pub async fn connect(addr: SocketAddr) -> Result<PaymentsClient, tonic::transport::Error> {
        let channel = Channel::from_shared(format!("http://{addr}")).expect("a URI").connect().await?;
        Ok(PaymentsClient { grpc: tonic::client::Grpc::new(channel) })
    }

    pub async fn pay(&mut self, request: Request<PayRequest>) -> Result<Response<Payment>, Status> {
        self.grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
        let codec = ProstCodec::<PayRequest, Payment>::default();
        self.grpc.unary(request, http::uri::PathAndQuery::from_static(PAY), codec).await
    }

    /// `Watch`'s payments, all of them.
    pub async fn watch(&mut self, request: Request<PayRequest>) -> Result<Vec<Payment>, Status> {
        self.grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
        let codec = ProstCodec::<PayRequest, Payment>::default();
        let path = http::uri::PathAndQuery::from_static(WATCH);
        let mut stream = self.grpc.server_streaming(request, path, codec).await?.into_inner();
        let mut payments = Vec::new();
        while let Some(payment) = stream.message().await? {
            payments.push(payment);
        }
        Ok(payments)
    }
}

/// A `Pay` request with `key` (and tenant `client`, in `x-client`).
pub fn keyed(key: &str, client: &str, message: PayRequest) -> Request<PayRequest> {
    let mut request = Request::new(message);
    request.metadata_mut().insert("idempotency-key", key.parse().expect("an ASCII key"));
    request.metadata_mut().insert("x-client", client.parse().expect("an ASCII client id"));
    request
}

/// Whether a response (its headers) says it was replayed.
pub fn replayed(metadata: &tonic::metadata::MetadataMap) -> bool {
    metadata.get(idem::grpc::REPLAYED).is_some_and(|v| v == "true")
}
