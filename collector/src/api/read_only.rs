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
use crate::core::snapshot::{read_only, Published};
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
        // A select the core answers anyway asks for no copy.
        if !read_only(query) {
            return None;
        }
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

#[cfg(test)]
mod tests {
    use msr_shared::admin::SelectQuery;

    use super::*;

    /// A select that names a leg (or asks for more than the draw) is the
    /// core's to answer: it leaves the copy unasked for, so a softswitch
    /// that only places legs has the loop make no copies (SPEC §11).
    #[test]
    fn a_select_the_core_answers_asks_for_no_copy() {
        let read_only = ReadOnly {
            published: Published::default(),
            metrics: Arc::new(Metrics::new()),
        };
        for query in [
            SelectQuery {
                call_id: Some("c1".into()),
                ..SelectQuery::new("default", "local")
            },
            SelectQuery {
                explain: true,
                ..SelectQuery::new("default", "local")
            },
            SelectQuery {
                codecs: vec!["pcma".into()],
                ..SelectQuery::new("default", "local")
            },
        ] {
            assert!(read_only.answer(&Request::Select(query.clone())).is_none());
            assert!(!read_only.published.wanted(), "{query:?}");
        }
        assert!(read_only.answer(&Request::Hello {}).is_none());
        assert!(!read_only.published.wanted());
        // A leg-less select asks for one (and, with none yet, the core
        // answers it).
        let plain = Request::Select(SelectQuery::new("default", "local"));
        assert!(read_only.answer(&plain).is_none());
        assert!(read_only.published.wanted());
    }
}
