//! The one place a front end answers a request itself: a `select` that
//! names no leg, drawn from the copy of the core the loop publishes
//! ([`crate::core::snapshot`]), and counted and timed in `/metrics` as the
//! loop counts and times the core's selections. The HTTP API and the
//! control socket use it; everything else, and every refusal, they ask of
//! the core.

use std::sync::Arc;

use msr_shared::admin::{Request, Response, ResponseData};
use tokio::time::Instant;

use crate::api::metrics::Metrics;
use crate::core::snapshot::Published;
use crate::core::Count;

/// What a front end needs to answer read-only selections.
#[derive(Clone)]
pub struct ReadOnly {
    /// The copy the loop publishes.
    pub published: Published,
    /// Where the selections are counted and timed.
    pub metrics: Arc<Metrics>,
}

impl ReadOnly {
    /// The answer to `request` when it is a `select` that changes nothing
    /// and the copy chooses an MSR; `None` when the core is to answer it
    /// ([`crate::core::snapshot::Snapshot::select`]).
    pub fn answer(&self, request: &Request) -> Option<Response> {
        let Request::Select(query) = request else {
            return None;
        };
        let started = Instant::now();
        let snapshot = self.published.current()?;
        let selection = snapshot.select(query, started, &mut rand::thread_rng())?;
        self.metrics.count(&Count::Selected {
            msr: selection.msr.clone(),
            leg: None,
        });
        self.metrics
            .selection_duration(started.elapsed().as_secs_f64());
        Some(Response::Ok(ResponseData::Selected(selection)))
    }
}
