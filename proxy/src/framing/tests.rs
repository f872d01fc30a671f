//! The framing rules, with the hostile heads kept as cases.

use super::*;

/// A request head: `version` 1.1 unless the URI says otherwise; headers as given,
/// repeated names appended.
fn head(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
    head_of(http::Version::HTTP_11, method, uri, headers)
}

fn head_of(version: http::Version, method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
    let mut builder = http::Request::builder()
        .version(version)
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(uri);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    builder.body(()).unwrap().into_parts().0
}

fn overrides() -> Vec<HeaderName> {
    vec![HeaderName::from_static("x-http-method-override")]
}

/// "ok", or the refusal's status and kind.
fn outcome(parts: &Parts) -> String {
    match check_head(parts, &overrides()) {
        Ok(()) => "ok".to_owned(),
        Err(e) => format!("{} {}", e.status().as_u16(), e.reason()),
    }
}

/// Goal: a `Connection` header may name hop-by-hop headers and connection options, but
/// never a header that frames, targets or fences the request, in any case, on any line,
/// in any position of its list.
/// Method: a table of `Connection` values and their outcome on a PUT with a token.
#[test]
fn connection_may_not_name_what_the_request_cannot_lose() {
    let cases = [
        ("keep-alive", "ok"),
        ("Keep-Alive", "ok"),
        ("close", "ok"),
        ("upgrade", "ok"),
        ("Upgrade, HTTP2-Settings", "ok"),
        ("TE", "ok"),
        ("keep-alive, x-custom-hop", "ok"),
        ("Proxy-Authorization, expect", "ok"),
        ("x-forwarded-for", "ok"),
        (" , ,", "ok"),
        // Hostile: each would make the proxy drop the header it names.
        ("Content-Length", "400 bad-connection"),
        ("content-length", "400 bad-connection"),
        ("keep-alive, Content-Length", "400 bad-connection"),
        ("close,CONTENT-LENGTH ", "400 bad-connection"),
        ("Transfer-Encoding", "400 bad-connection"),
        ("Trailer", "400 bad-connection"),
        ("Host", "400 bad-connection"),
        ("Fencing-Token", "400 bad-connection"),
        ("fencing-token-proof", "400 bad-connection"),
        ("Fencing-Scope", "400 bad-connection"),
        ("Content-Range", "400 bad-connection"),
        ("Content-Encoding", "400 bad-connection"),
        ("content-type", "400 bad-connection"),
        ("X-HTTP-Method-Override", "400 bad-connection"),
        // A name that only starts like one is a name of its own.
        ("content", "ok"),
        ("hosts", "ok"),
        ("fencing-token-current", "ok"),
    ];
    for (connection, want) in cases {
        let parts = head(
            "PUT",
            "/a",
            &[
                ("host", "x"),
                ("fencing-token", "1"),
                ("connection", connection),
            ],
        );
        assert_eq!(outcome(&parts), want, "Connection: {connection}");
    }
    // A second `Connection` line counts as much as the first.
    let parts = head(
        "PUT",
        "/a",
        &[
            ("host", "x"),
            ("connection", "keep-alive"),
            ("connection", "x-a, content-length"),
        ],
    );
    assert_eq!(outcome(&parts), "400 bad-connection");
    let err = check_head(&parts, &overrides()).unwrap_err();
    assert!(err.to_string().contains("content-length"), "{err}");
}

/// Goal: one well-formed `Host`, agreeing with an absolute-form target, passes; a
/// repeated, malformed, missing (HTTP/1.1) or contradicting one is refused.
/// Method: a table of targets and `Host` lines.
#[test]
fn host_must_be_one_and_agree_with_the_target() {
    let cases: [(&str, &[&str], &str); 16] = [
        ("/a", &["x"], "ok"),
        ("/a", &["example.com:8080"], "ok"),
        ("/a", &["[::1]:8080"], "ok"),
        ("/a", &["EXAMPLE.com"], "ok"),
        ("http://example.com/a", &["example.com"], "ok"),
        ("http://example.com/a", &["Example.COM"], "ok"),
        ("http://example.com/a", &[], "ok"),
        // Hostile.
        ("/a", &["x", "y"], "400 bad-host"),
        ("/a", &["x", "x"], "400 bad-host"),
        ("/a", &[], "400 bad-host"),
        ("/a", &[""], "400 bad-host"),
        ("/a", &["x/y"], "400 bad-host"),
        ("/a", &["x y"], "400 bad-host"),
        ("/a", &["user@x"], "400 bad-host"),
        ("http://other/a", &["x"], "400 bad-host"),
        ("http://example.com:80/a", &["example.com"], "400 bad-host"),
    ];
    for (uri, hosts, want) in cases {
        let headers: Vec<(&str, &str)> = hosts.iter().map(|h| ("host", *h)).collect();
        assert_eq!(
            outcome(&head("GET", uri, &headers)),
            want,
            "{uri} {hosts:?}"
        );
    }
    // HTTP/1.0 may leave `Host` out; the upstream's is sent for it.
    let old = head_of(http::Version::HTTP_10, "GET", "/a", &[]);
    assert_eq!(outcome(&old), "ok");
    // HTTP/2 names its host in `:authority`; a `host` header must agree.
    let h2 = head_of(http::Version::HTTP_2, "GET", "http://x/a", &[]);
    assert_eq!(outcome(&h2), "ok");
    let h2 = head_of(http::Version::HTTP_2, "GET", "http://x/a", &[("host", "y")]);
    assert_eq!(outcome(&h2), "400 bad-host");
    // CONNECT's target is a host to tunnel to, not this one's: classification refuses
    // it (405), whatever its `Host`.
    let connect = head("CONNECT", "storage.test:443", &[("host", "storage.test")]);
    assert_eq!(outcome(&connect), "ok");
}

/// Goal: a body may be sent plain or chunked once; every other transfer coding, before
/// `chunked` or after it, on the same line or another, is 501.
/// Method: a table of `Transfer-Encoding` lines.
#[test]
fn only_a_single_chunked_coding_passes() {
    let cases: [(&[&str], &str); 10] = [
        (&[], "ok"),
        (&["chunked"], "ok"),
        (&["Chunked"], "ok"),
        (&[", chunked"], "ok"),
        // Hostile: each would lose a coding on the way.
        (&["gzip, chunked"], "501 unsupported-transfer-coding"),
        (&["gzip", "chunked"], "501 unsupported-transfer-coding"),
        (&["chunked, chunked"], "501 unsupported-transfer-coding"),
        (&["identity, chunked"], "501 unsupported-transfer-coding"),
        (&["chunked", "gzip"], "501 unsupported-transfer-coding"),
        (&["x-custom"], "501 unsupported-transfer-coding"),
    ];
    for (lines, want) in cases {
        let mut headers = vec![("host", "x")];
        headers.extend(lines.iter().map(|l| ("transfer-encoding", *l)));
        assert_eq!(
            outcome(&head("POST", "/a", &headers)),
            want,
            "Transfer-Encoding {lines:?}"
        );
    }
    let err = check_head(
        &head(
            "POST",
            "/a",
            &[("host", "x"), ("transfer-encoding", "gzip, chunked")],
        ),
        &[],
    )
    .unwrap_err();
    assert!(err.to_string().contains("gzip, chunked"), "{err}");
}

/// Goal: GET and HEAD carry no body unless their route takes one; other methods, and
/// GET and HEAD without a body, are not concerned.
/// Method: `check_body` over methods, with and without a body and the route's flag.
#[test]
fn get_and_head_bodies_need_their_route() {
    for method in ["GET", "HEAD"] {
        let parts = head(method, "/a", &[("host", "x")]);
        let err = check_body(&parts, true, false).unwrap_err();
        assert_eq!(
            (err.status().as_u16(), err.reason()),
            (400, "body-on-read"),
            "{method}"
        );
        assert!(err.to_string().contains("read_bodies"), "{err}");
        assert!(check_body(&parts, true, true).is_ok(), "{method}");
        assert!(check_body(&parts, false, false).is_ok(), "{method}");
    }
    for method in ["OPTIONS", "PROPFIND", "POST", "PUT", "DELETE"] {
        let parts = head(method, "/a", &[("host", "x")]);
        assert!(check_body(&parts, true, false).is_ok(), "{method}");
    }
}
