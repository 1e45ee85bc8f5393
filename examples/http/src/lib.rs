//! The payment API of the HTTP example and tests: `POST /payments` behind
//! the `Idempotency-Key` layer, counting how often its handler really ran.
//!
//! The request body steers the handler, so one server serves every case:
//! `{"amount_cents": 500}` pays; `"delay_ms"` makes it slow (a duplicate
//! arrives while it runs); `"block_ms"` blocks its thread that long
//! (synchronous work that never yields); `"fail_with"` answers that status instead;
//! `"response_bytes"` pads the answer (over the layer's limit, say);
//! `"chunks"` streams the answer in that many chunks; `"panic": true`
//! makes the handler panic; `"charge_step": true` charges the card in a
//! recorded step (from the request's extensions), and with
//! `"fail_first_after_charge": true` the handler's first run answers `503`
//! after it (nothing kept: the retry replays the charge, not runs it). A
//! guarded payment answers its lease's fence
//! in `x-fence` (from the request's extensions: what an outside write
//! would carry).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Extension;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idem::http::IdempotencyLayer;
use idem::lease::{LeaseInfo, Steps};

/// What a client posts.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct PaymentRequest {
    pub amount_cents: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_with: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_bytes: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks: Option<usize>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub panic: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub charge_step: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fail_first_after_charge: bool,
}

/// What the endpoint answers.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Payment {
    pub payment_id: u64,
    pub amount_cents: i64,
    #[serde(default)]
    pub padding: String,
}

/// The shop's state: how many payments its handler made, and how many
/// times a card was charged.
#[derive(Clone, Debug, Default)]
pub struct Shop {
    runs: Arc<AtomicU64>,
    charges: Arc<AtomicU64>,
}

impl Shop {
    /// Times the payment handler ran.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }

    /// Times a card was charged (the card network does not deduplicate).
    pub fn charges(&self) -> u64 {
        self.charges.load(Ordering::SeqCst)
    }
}

async fn pay(
    State(shop): State<Shop>,
    lease: Option<Extension<LeaseInfo>>,
    steps: Option<Extension<Steps<'static>>>,
    axum::Json(req): axum::Json<PaymentRequest>,
) -> Response {
    let payment_id = shop.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let mut charge = None;
    if req.charge_step {
        let Some(Extension(steps)) = steps else {
            return (StatusCode::INTERNAL_SERVER_ERROR, "no step log: is the route guarded?").into_response();
        };
        let charged = steps
            .run("charge", |key| async move {
                shop.charges.fetch_add(1, Ordering::SeqCst);
                Ok::<_, idem::Error>(format!("ch_{key}"))
            })
            .await;
        match charged {
            Ok(charged) => charge = Some((charged, steps.recorded())),
            Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
        }
        if req.fail_first_after_charge && payment_id == 1 {
            return (StatusCode::SERVICE_UNAVAILABLE, "the ledger was down after the charge").into_response();
        }
    }
    if let Some(ms) = req.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(ms) = req.block_ms {
        std::thread::sleep(Duration::from_millis(ms));
    }
    if req.panic {
        panic!("the payment handler panicked (asked to, by the request)");
    }
    if let Some(status) = req.fail_with {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return (status, format!("payment {payment_id} failed")).into_response();
    }
    let padding = "x".repeat(req.response_bytes.unwrap_or(0));
    let payment = Payment { payment_id, amount_cents: req.amount_cents, padding };
    let json = serde_json::to_vec(&payment).expect("a payment serialises");
    let body = match req.chunks {
        // A streamed answer, chunk by chunk.
        Some(n) if n > 1 => {
            let size = json.len().div_ceil(n);
            let chunks: Vec<Result<Vec<u8>, std::io::Error>> = json.chunks(size).map(|c| Ok(c.to_vec())).collect();
            Body::from_stream(pieces(chunks))
        }
        _ => Body::from(json),
    };
    let mut response = (StatusCode::CREATED, body).into_response();
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("location", HeaderValue::from_str(&format!("/payments/{payment_id}")).expect("ascii"));
    headers.append("x-audit", HeaderValue::from_static("first"));
    headers.append("x-audit", HeaderValue::from_static("second"));
    if let Some(Extension(lease)) = lease {
        headers.insert("x-fence", HeaderValue::from(lease.fence));
    }
    if let Some((charge, replayed_steps)) = charge {
        headers.insert("x-charge", HeaderValue::from_str(&charge).expect("ascii"));
        headers.insert("x-steps-replayed", HeaderValue::from(replayed_steps));
    }
    response
}

/// A stream over a vector's items, yielding between them (so the body
/// really arrives in pieces).
fn pieces<T: Send + Unpin + 'static>(items: Vec<T>) -> impl futures_core::Stream<Item = T> + Send {
    struct Iter<T>(std::vec::IntoIter<T>, bool);
    impl<T: Unpin> futures_core::Stream for Iter<T> {
        type Item = T;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<T>> {
            // Every other poll is pending once, as a network would be.
            self.1 = !self.1;
            if self.1 {
                cx.waker().wake_by_ref();
                return std::task::Poll::Pending;
            }
            std::task::Poll::Ready(self.0.next())
        }
    }
    Iter(items.into_iter(), false)
}

async fn count(State(shop): State<Shop>) -> String {
    shop.runs().to_string()
}

/// The API: `POST /payments` behind `layer`, `GET /payments/count` (not
/// guarded: GET is idempotent by definition).
pub fn app(shop: Shop, layer: IdempotencyLayer) -> Router {
    Router::new().route("/payments", post(pay)).route("/payments/count", get(count)).with_state(shop).layer(layer)
}

/// Serve `app` on a free loopback port; its address.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("the server runs");
    });
    addr
}
