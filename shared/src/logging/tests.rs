use std::io;
use std::sync::{Arc, Mutex};

use tracing_subscriber::layer::SubscriberExt;

use super::*;

#[test]
fn printable_escapes_control_characters_and_cuts() {
    assert_eq!(
        printable("ESCTEST\u{1b}[31mRED\r\nfake line\u{7}\u{9b}", 64),
        "ESCTEST\\u{1b}[31mRED\\r\\nfake line\\u{7}\\u{9b}"
    );
    assert_eq!(printable("abcdef", 3), "abc…");
    assert_eq!(printable("žluť", 10), "žluť");
}

/// A writer the test reads back.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl io::Write for Buffer {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| io::ErrorKind::Other)?
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Buffer {
    fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().expect("buffer").clone();
        String::from_utf8(bytes)
            .expect("utf-8")
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

fn logging(limit: &FloodLimit, buffer: &Buffer) -> impl Subscriber {
    let writer = buffer.clone();
    tracing_subscriber::registry().with(limit.clone()).with(
        tracing_subscriber::fmt::layer()
            .fmt_fields(EscapingFields)
            .with_ansi(false)
            .with_writer(move || writer.clone()),
    )
}

#[test]
fn every_field_is_escaped() {
    let buffer = Buffer::default();
    let limit = FloodLimit::default();
    tracing::subscriber::with_default(logging(&limit, &buffer), || {
        let call_id = "ESCTEST\u{1b}[31mRED\nforged";
        tracing::info!(call_id = %call_id, debug = ?call_id, n = 3, "notify \u{1b}refused");
    });
    let lines = buffer.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert!(!line.contains('\u{1b}'), "{line}");
    assert!(
        line.contains("notify \\u{1b}refused call_id=\"ESCTEST\\u{1b}[31mRED\\nforged\" debug="),
        "{line}"
    );
}

#[test]
fn a_burst_of_stack_warnings_is_bounded_and_counted() {
    let buffer = Buffer::default();
    let limit = FloodLimit::default();
    tracing::subscriber::with_default(logging(&limit, &buffer), || {
        for i in 0..10_000 {
            tracing::warn!(target: "rsipstack::transaction::endpoint", addr = i, "on_received_message error");
            tracing::info!(target: NETWORK, call_id = i, "notify refused");
        }
        // Not limited: our own lines, and the stack's at info.
        tracing::info!(target: "rsipstack::transport", "datagram");
        tracing::info!("binding added");
        limit.finish();
    });
    let lines = buffer.lines();
    let count = |s: &str| lines.iter().filter(|l| l.contains(s)).count();
    assert_eq!(count("on_received_message error"), 1, "{lines:?}");
    assert_eq!(count("notify refused"), 1, "{lines:?}");
    assert_eq!(count("log lines suppressed"), 2, "{lines:?}");
    assert_eq!(count("suppressed=9999"), 2, "{lines:?}");
    assert_eq!(count("datagram"), 1);
    assert_eq!(count("binding added"), 1);
    assert_eq!(lines.len(), 6, "{lines:?}");
}

#[tokio::test(start_paused = true)]
async fn the_periodic_flush_reports_a_flood_that_stopped() {
    let buffer = Buffer::default();
    let limit = FloodLimit::default();
    let _default = tracing::subscriber::set_default(logging(&limit, &buffer));
    for i in 0..50 {
        tracing::info!(target: NETWORK, call_id = i, "notify refused");
    }
    assert_eq!(buffer.lines().len(), 1);
    let flusher = tokio::spawn(limit.clone().flush_periodically());
    // Virtual time: the window (60 s) ends, and the next flush reports it.
    tokio::time::sleep(LimitPolicy::default().window + FLUSH_PERIOD).await;
    flusher.abort();
    let lines = buffer.lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[1].contains("log lines suppressed") && lines[1].contains("suppressed=49"),
        "{lines:?}"
    );
}

#[test]
fn a_call_site_is_shown_from_its_crate_on() {
    assert_eq!(
        short_site("event /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/rsipstack-0.7.14/src/transaction/endpoint.rs:306"),
        "rsipstack-0.7.14/src/transaction/endpoint.rs:306"
    );
    assert_eq!(
        short_site("event collector/src/shell.rs:643"),
        "collector/src/shell.rs:643"
    );
}

/// A value that a stranger chose cannot forge the fields after it: one
/// with a space or a quote is quoted, its quotes escaped.
#[test]
fn a_value_with_a_space_or_a_quote_is_quoted() {
    let buffer = Buffer::default();
    let limit = FloodLimit::default();
    tracing::subscriber::with_default(logging(&limit, &buffer), || {
        let forged = "msr_1 reason=ok source=10.0.0.5";
        let quote = "a\" b=\"c";
        let uri = "sip:msr_1@127.0.0.1;engine=127.0.0.1:5090";
        tracing::info!(msr = %forged, plain = %"msr_2", debug = ?forged, quote = %quote, empty = %"", uri = %uri, source = "127.0.0.1:5060", "registration refused");
    });
    let lines = buffer.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert!(
        line.contains(r#"registration refused msr="msr_1 reason=ok source=10.0.0.5" plain=msr_2 debug="msr_1 reason=ok source=10.0.0.5" quote="a\" b=\"c" empty="" uri=sip:msr_1@127.0.0.1;engine=127.0.0.1:5090 source="127.0.0.1:5060""#),
        "{line}"
    );
}
