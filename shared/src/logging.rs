//! How both daemons log: the filter they start from (their `-v`/`-q`
//! flags), the escaping of every value, and the rate limit of the lines
//! anyone on the network can cause.
//!
//! Both daemons log every datagram they send or receive at `info`, raw
//! message included, with target [`WIRE`] ([`log_datagram`]); at our
//! `info` that would drown the lines an operator reads, so those lines,
//! and the SIP library's own (target `rsipstack`), are held one level
//! below ours until `-vv`.
//!
//! Values in a log line may come from the network (a Call-ID, a Contact, a
//! parse error quoting a datagram): [`EscapingFields`] formats every field
//! of every line, ours and any library's, with control characters escaped
//! ([`printable`]), so no value can move the cursor, colour a terminal or
//! forge a line.
//!
//! Lines that a stranger can cause by sending a datagram or opening a
//! connection — the SIP library's warnings, should it give any, and
//! ours logged with target [`NETWORK`] (a refused NOTIFY, a refused control
//! connection…) — pass through [`FloodLimit`]: one line
//! per call site per 60 s, 100 lines per 60 s in all, and a
//! `log lines suppressed` line with the count of those held back
//! ([`crate::log_limit`], the mechanism the registrar's refusals use).

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::layer::{Context, Layer};

use crate::log_limit::{LimitPolicy, Limited, LimitedLine, LineLimiter};

/// The target of our lines that anyone can cause, as often as they like
/// (a datagram, a connection): rate limited by [`FloodLimit`] like
/// the SIP library's warnings.
pub const NETWORK: &str = "network";

/// The target of the lines that show every SIP datagram sent and
/// received, raw message included (`udp received`, `udp send`): off at
/// the default level, on with `-vv` or `RUST_LOG=…,sip_wire=info`.
pub const WIRE: &str = "sip_wire";

/// One datagram at target [`WIRE`]: its peer, length, `CSeq` and text.
/// Callers check `tracing::enabled!(target: WIRE, Level::INFO)` first:
/// the text is copied.
pub fn log_datagram(what: &'static str, peer: SocketAddr, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let cseq = text
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("cseq")
                .then(|| value.trim())
        })
        .unwrap_or_default();
    if what == "udp send" {
        tracing::info!(target: WIRE, len = bytes.len(), dst = %peer, cseq = %cseq, raw_message = ?text, "{what}");
    } else {
        tracing::info!(target: WIRE, len = bytes.len(), src = %peer, cseq = %cseq, raw_message = ?text, "{what}");
    }
}

/// How often [`FloodLimit::flush_periodically`] looks for windows that
/// ended (a fraction of the 60 s window, so a count is at most this late).
pub const FLUSH_PERIOD: Duration = Duration::from_secs(5);

/// `s` cut to `max_chars` characters (`…` marks a cut) with every control
/// character escaped (`\u{1b}`, `\n`): safe to put in a log line.
pub fn printable(s: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max_chars));
    for (i, c) in s.chars().enumerate() {
        if i == max_chars {
            out.push('…');
            break;
        }
        push_printable(&mut out, c);
    }
    out
}

fn push_printable(out: &mut String, c: char) {
    // Writing to a `String` cannot fail.
    let _ = push_escaped(out, c);
}

/// A [`fmt::Write`] that escapes control characters on the way through.
struct Escaping<'a, W: fmt::Write + ?Sized>(&'a mut W);

impl<W: fmt::Write + ?Sized> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if !s.chars().any(char::is_control) {
            return self.0.write_str(s);
        }
        let mut escaped = String::with_capacity(s.len() + 8);
        for c in s.chars() {
            push_printable(&mut escaped, c);
        }
        self.0.write_str(&escaped)
    }
}

fn write_field(w: &mut Writer<'_>, field: &Field, value: &dyn fmt::Debug) -> fmt::Result {
    use fmt::Write as _;
    match field.name() {
        "message" => write!(Escaping(w), "{value:?}"),
        name => {
            write!(w, "{}=", name.strip_prefix("r#").unwrap_or(name))?;
            let text = format!("{value:?}");
            if needs_quotes(&text) {
                w.write_char('"')?;
                for c in text.chars() {
                    if c == '"' || c == '\\' {
                        w.write_char('\\')?;
                    }
                    push_escaped(w, c)?;
                }
                w.write_char('"')
            } else {
                Escaping(w).write_str(&text)
            }
        }
    }
}

/// Whether a field's value must be quoted to stay one value: a space or a
/// quote in it would let whoever chose it (a Call-ID, a From name) forge
/// fields after it (`source=10.0.0.5`) for a log parser, which splits a
/// line at its spaces. A value its `Debug` quoted already (a `?string`)
/// is left as it is.
fn needs_quotes(text: &str) -> bool {
    if let Some(inner) = text
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    {
        // Quoted by `Debug`: every quote inside is escaped.
        let mut escaped = false;
        let closed_early = inner.chars().any(|c| {
            let unescaped_quote = c == '"' && !escaped;
            escaped = c == '\\' && !escaped;
            unescaped_quote
        });
        return closed_early;
    }
    text.is_empty() || text.chars().any(|c| c.is_whitespace() || c == '"')
}

/// `c` to `w`, a control character escaped as [`printable`] does.
fn push_escaped(w: &mut impl fmt::Write, c: char) -> fmt::Result {
    if c.is_control() {
        c.escape_default().try_for_each(|e| w.write_char(e))
    } else {
        w.write_char(c)
    }
}

/// The field formatter of both daemons' log lines: `message k=v k=v` as
/// tracing-subscriber's default, every value with its control characters
/// escaped.
#[derive(Debug, Clone, Copy, Default)]
pub struct EscapingFields;

impl<'w> FormatFields<'w> for EscapingFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = FieldVisitor {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

/// Writes the fields of one line, space-separated.
struct FieldVisitor<'w> {
    writer: Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl Visit for FieldVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() {
            return;
        }
        if !self.first {
            self.result = fmt::Write::write_char(&mut self.writer, ' ');
        }
        self.first = false;
        if self.result.is_ok() {
            self.result = write_field(&mut self.writer, field, value);
        }
    }
}

/// One call site of a rate-limited line.
#[derive(Debug, Clone)]
struct Site {
    target: &'static str,
    /// `file:line` of the call site (tracing's event name).
    name: &'static str,
    level: Level,
    suppressed: u64,
}

impl Limited for Site {
    fn key(&self) -> String {
        format!("{}:{}", self.target, self.name)
    }
    fn set_suppressed(&mut self, suppressed: u64) {
        self.suppressed = suppressed;
    }
    fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

/// The rate limit of the lines a stranger can cause (module doc), as a
/// tracing layer: a line over the limit is not logged at all, and the
/// count of those held back is logged when the call site's window ends
/// (on its next line, or [`flush`](Self::flush)).
#[derive(Debug, Clone)]
pub struct FloodLimit {
    limiter: Arc<Mutex<LineLimiter<Site>>>,
}

impl Default for FloodLimit {
    fn default() -> Self {
        Self::new(LimitPolicy::default())
    }
}

impl FloodLimit {
    /// A layer with the given bounds.
    pub fn new(policy: LimitPolicy) -> Self {
        Self {
            limiter: Arc::new(Mutex::new(LineLimiter::new(policy))),
        }
    }

    /// Whether lines of this target and level are limited: the SIP
    /// library's warnings and errors (any would be per message), and all
    /// of [`NETWORK`].
    fn limits(target: &str, level: &Level) -> bool {
        target == NETWORK || (target.starts_with("rsipstack") && *level <= Level::WARN)
    }

    /// Logs the counts of the windows that ended by now (a daemon calls
    /// this periodically, so a flood that stopped is still reported).
    pub fn flush(&self) {
        self.report(|l| l.advance(Instant::now()));
    }

    /// [`flush`](Self::flush) every [`FLUSH_PERIOD`], for ever: each daemon
    /// spawns this on its runtime, so the count of a flood that stopped is
    /// logged at most a period after its window ended, not only when the
    /// next limited line or the shutdown comes.
    pub async fn flush_periodically(self) {
        let mut ticks = tokio::time::interval(FLUSH_PERIOD);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.flush();
        }
    }

    /// Logs every count held back (shutdown).
    pub fn finish(&self) {
        self.report(|l| l.finish(Instant::now()));
    }

    fn report(&self, f: impl FnOnce(&mut LineLimiter<Site>)) {
        let out = match self.limiter.lock() {
            Ok(mut l) => {
                f(&mut l);
                std::iter::from_fn(|| l.poll()).collect::<Vec<_>>()
            }
            Err(_) => return,
        };
        log_counts(out);
    }
}

/// A call site as a log line shows it: tracing's `event FILE:LINE` without
/// the word, and a dependency's file from its crate's folder on (not the
/// build host's path to cargo's registry).
fn short_site(name: &str) -> &str {
    let name = name.strip_prefix("event ").unwrap_or(name);
    match name.rsplit_once("/registry/src/") {
        Some((_, in_index)) => in_index.split_once('/').map_or(in_index, |(_, file)| file),
        None => name,
    }
}

/// Logs what the limiter gave out besides a line let through.
fn log_counts(out: Vec<LimitedLine<Site>>) {
    for line in out {
        match line {
            LimitedLine::Line(site) => tracing::warn!(
                target: "msr_shared::logging",
                site_target = site.target,
                site = short_site(site.name),
                level = %site.level,
                suppressed = site.suppressed + 1,
                "log lines suppressed"
            ),
            LimitedLine::Unlogged { count } => tracing::warn!(
                target: "msr_shared::logging",
                count,
                "log lines not logged individually"
            ),
        }
    }
}

impl<S: Subscriber> Layer<S> for FloodLimit {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if !Self::limits(meta.target(), meta.level()) {
            return true;
        }
        let site = Site {
            target: meta.target(),
            name: meta.name(),
            level: *meta.level(),
            suppressed: 0,
        };
        let (given, mut out) = match self.limiter.lock() {
            Ok(mut l) => {
                let given = l.record(Instant::now(), site);
                (given, std::iter::from_fn(|| l.poll()).collect::<Vec<_>>())
            }
            // A panic elsewhere while logging: log rather than lose lines.
            Err(_) => return true,
        };
        if given {
            // The last line given out is this event itself.
            out.pop();
        }
        log_counts(out);
        given
    }
}

/// The `tracing_subscriber::EnvFilter` directive for a verbosity:
/// `-2` errors only, `-1` warnings, `0` info (default), `1` debug, `2+` trace.
/// `RUST_LOG`, when set, replaces it.
pub fn filter_directive(verbosity: i8) -> &'static str {
    match verbosity {
        i8::MIN..=-2 => "error",
        -1 => "warn",
        0 => "info,rsipstack=warn,sip_wire=warn",
        1 => "debug,rsipstack=info,sip_wire=info",
        // notify (the agent's config watcher) traces every inotify event,
        // including writes to a log file next to the config: a feedback loop.
        _ => "trace,notify=info",
    }
}

/// Makes a panic anywhere in the daemon end the process: the default hook
/// prints the panic, the log gets an error line, and the process aborts.
/// A panic is a bug, and a thread that died of one (the SIP reader, the
/// endpoint's task) would leave a daemon that looks alive and serves
/// nothing; aborting lets its supervisor (systemd's `Restart=`) start it
/// again, and nothing acknowledged is lost (a REGISTER's `200` leaves only
/// once its binding is on disk). Called once at start by each daemon's
/// `main`, after its log is set up.
pub fn abort_on_panic(daemon: &'static str) {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        tracing::error!(daemon, panic = %info, "a thread panicked: aborting the process so its supervisor restarts it");
        std::process::abort();
    }));
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod filter_tests {
    #[test]
    fn default_keeps_the_stack_quiet() {
        assert_eq!(
            super::filter_directive(0),
            "info,rsipstack=warn,sip_wire=warn"
        );
        assert_eq!(super::filter_directive(-5), "error");
        assert_eq!(super::filter_directive(9), "trace,notify=info");
    }
}
