//! The status pages' HTML, shared by the proxy's and the node's `GET /`: escaping, the
//! page frame (one inline style sheet, a self-refresh, no script), and times written as
//! "2026-11-23 16:38:10 UTC (12 s ago)".
//!
//! Every value that reaches a page goes through [`escape`] (or [`Page::text`] and
//! [`cell`], which call it): scope names, paths and error messages come from
//! clients and are never trusted as markup.

use std::fmt::Write as _;
use std::time::SystemTime;

use palisade_protocol::audit::{parse_rfc3339, rfc3339};

/// Seconds between a status page's refreshes (`<meta http-equiv="refresh">`): often
/// enough to watch a failover, rarely enough that an open tab costs nothing.
pub const STATUS_REFRESH_S: u32 = 2;

/// The `Content-Security-Policy` of every status page: nothing may load or run but the
/// page's own inline style sheet (no script at all, no frames, no forms, no images).
pub const STATUS_PAGE_CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// A status page as an HTTP answer: the HTML with `X-Content-Type-Options: nosniff` (never
/// read as anything but HTML), [`STATUS_PAGE_CSP`] (no script runs, even if an escape were
/// ever missed) and `Cache-Control: no-store` (fences and members are live state, never to
/// be served from a cache).
pub fn page_response(html: String) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    use http::header;
    (
        [
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CONTENT_SECURITY_POLICY, STATUS_PAGE_CSP),
            (header::CACHE_CONTROL, "no-store"),
        ],
        axum::response::Html(html),
    )
        .into_response()
}

/// `text` with `&`, `<`, `>`, `"` and `'` replaced by entities: safe inside an element
/// and inside a quoted attribute.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// How long ago `then` was, for people: "just now", "12 s ago", "3 min ago", "2 h ago",
/// "4 d ago".
pub fn ago(then: SystemTime, now: SystemTime) -> String {
    let Ok(elapsed) = now.duration_since(then) else {
        return "just now".to_owned();
    };
    let s = elapsed.as_secs();
    match s {
        0 => "just now".to_owned(),
        1..120 => format!("{s} s ago"),
        120..7200 => format!("{} min ago", s / 60),
        7200..172_800 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

/// An RFC 3339 time as "2026-11-23 16:38:10 UTC (12 s ago)"; text that is not a time is
/// shown as it is.
pub fn when(rfc: &str, now: SystemTime) -> String {
    match parse_rfc3339(rfc) {
        Ok(at) => {
            let text = rfc3339(at);
            format!("{} {} UTC ({})", &text[..10], &text[11..19], ago(at, now))
        }
        Err(_) => rfc.to_owned(),
    }
}

const STYLE: &str = "\
body{font:15px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1b1f24;background:#f6f7f9}\
header{background:#1f2a37;color:#fff;padding:14px 28px}\
header h1{margin:0;font-size:20px;font-weight:600}\
header p{margin:4px 0 0;color:#c9d2dc;font-size:13px}\
main{padding:8px 28px 28px;max-width:1200px}\
h2{font-size:16px;margin:22px 0 8px;color:#1f2a37}\
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px rgba(0,0,0,.08);min-width:420px}\
th,td{padding:6px 12px;border-bottom:1px solid #e4e7eb;text-align:left;vertical-align:top}\
th{background:#eef1f4;font-weight:600;font-size:13px}\
td.num{text-align:right;font-variant-numeric:tabular-nums}\
code,td.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:13px;word-break:break-all}\
.ok{color:#116329;font-weight:600}.bad{color:#b42318;font-weight:600}.warn{color:#9a6700;font-weight:600}\
.muted{color:#667085}\
dl{display:grid;grid-template-columns:max-content auto;gap:4px 18px;background:#fff;padding:10px 14px;\
box-shadow:0 1px 2px rgba(0,0,0,.08);width:max-content;margin:0}\
dt{font-weight:600}dd{margin:0}";

/// A status page being written.
pub struct Page {
    html: String,
}

impl Page {
    /// Starts a page titled `title` with a subtitle line, refreshing itself every
    /// [`STATUS_REFRESH_S`] seconds.
    pub fn new(title: &str, subtitle: &str) -> Self {
        let mut html = String::with_capacity(16 * 1024);
        let _ = write!(
            html,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta http-equiv=\"refresh\" content=\"{STATUS_REFRESH_S}\">\
             <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
             <title>{t}</title><style>{STYLE}</style></head>\n<body><header><h1>{t}</h1><p>{s}</p></header><main>\n",
            t = escape(title),
            s = escape(subtitle),
        );
        Self { html }
    }

    /// A section heading.
    pub fn heading(&mut self, text: &str) {
        let _ = writeln!(self.html, "<h2>{}</h2>", escape(text));
    }

    /// A paragraph of text; `class` styles it (`muted`, `ok`, `bad`, `warn`, or "").
    pub fn text(&mut self, class: &str, text: &str) {
        let _ = writeln!(
            self.html,
            "<p class=\"{}\">{}</p>",
            escape(class),
            escape(text)
        );
    }

    /// A definition list of (term, value, value class) rows.
    pub fn facts(&mut self, rows: &[(&str, String, &str)]) {
        self.html.push_str("<dl>");
        for (term, value, class) in rows {
            let _ = write!(
                self.html,
                "<dt>{}</dt><dd class=\"{}\">{}</dd>",
                escape(term),
                escape(class),
                escape(value)
            );
        }
        self.html.push_str("</dl>\n");
    }

    /// A table with `head` and `rows` of cells, each cell (text, class); class `num`
    /// aligns numbers, `mono` sets code-like text. `empty` is shown when there are no
    /// rows.
    pub fn table(&mut self, head: &[&str], rows: &[Vec<(String, &str)>], empty: &str) {
        if rows.is_empty() {
            self.text("muted", empty);
            return;
        }
        self.html.push_str("<table><thead><tr>");
        for h in head {
            let _ = write!(self.html, "<th>{}</th>", escape(h));
        }
        self.html.push_str("</tr></thead><tbody>\n");
        for row in rows {
            self.html.push_str("<tr>");
            for (text, class) in row {
                let _ = write!(
                    self.html,
                    "<td class=\"{}\">{}</td>",
                    escape(class),
                    escape(text)
                );
            }
            self.html.push_str("</tr>\n");
        }
        self.html.push_str("</tbody></table>\n");
    }

    /// Ends the page with a footer line and returns it.
    pub fn finish(mut self, footer: &str) -> String {
        let _ = writeln!(
            self.html,
            "<p class=\"muted\">{}</p></main></body></html>",
            escape(footer)
        );
        self.html
    }
}

/// A cell of text.
pub fn cell(text: impl Into<String>, class: &str) -> (String, &str) {
    (text.into(), class)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Goal: a status page is answered with nosniff, a policy that runs no script and
    /// loads nothing (the inline style only), and no-store. Method: build one, read its
    /// headers.
    #[test]
    fn page_response_forbids_script_sniffing_and_caching() {
        let answer = page_response("<p>hi</p>".to_owned());
        let header =
            |name: http::header::HeaderName| answer.headers()[name].to_str().unwrap().to_owned();
        assert_eq!(header(http::header::X_CONTENT_TYPE_OPTIONS), "nosniff");
        assert_eq!(header(http::header::CACHE_CONTROL), "no-store");
        let csp = header(http::header::CONTENT_SECURITY_POLICY);
        assert!(csp.starts_with("default-src 'none'"), "{csp}");
        assert!(
            !csp.contains("script-src"),
            "no script source is ever allowed: {csp}"
        );
        assert!(header(http::header::CONTENT_TYPE).starts_with("text/html"));
    }

    /// Goal: markup in a value comes out as text, in cells, facts and headings alike.
    /// Method: render a page holding `<script>` and quotes; look for the raw tag.
    #[test]
    fn values_are_escaped_everywhere() {
        let hostile = "<script>alert('x')</script>\"&";
        let mut page = Page::new(hostile, hostile);
        page.heading(hostile);
        page.text(hostile, hostile);
        page.facts(&[(hostile, hostile.to_owned(), hostile)]);
        page.table(&[hostile], &[vec![cell(hostile, hostile)]], hostile);
        let html = page.finish(hostile);
        assert!(!html.contains("<script>"), "{html}");
        assert!(!html.contains("'x'"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&amp;"));
    }

    /// Goal: ages read as people say them. Method: a few durations.
    #[test]
    fn ages_read_naturally() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let at = |s| now - Duration::from_secs(s);
        assert_eq!(ago(at(0), now), "just now");
        assert_eq!(ago(at(12), now), "12 s ago");
        assert_eq!(ago(at(600), now), "10 min ago");
        assert_eq!(ago(at(7200), now), "2 h ago");
        assert_eq!(ago(now + Duration::from_secs(5), now), "just now");
        assert_eq!(
            when("1970-01-12T13:46:28.000Z", now),
            "1970-01-12 13:46:28 UTC (12 s ago)"
        );
    }
}
