//! The normaliser and the classifier, with the hostile inputs kept as cases.

use super::*;
use crate::config::ProxyConfig;

fn head(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
    let mut builder = http::Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(uri);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    builder.body(()).unwrap().into_parts().0
}

fn route(prefix: &str, scope: &str) -> Route {
    Route {
        prefix: prefix.into(),
        scope: Some(scope.into()),
        ..Route::default()
    }
}

fn classifier(config: &ProxyConfig) -> Classifier {
    config.validate().unwrap();
    Classifier::new(config)
}

fn billing() -> Classifier {
    classifier(&ProxyConfig {
        routes: vec![Route {
            case_insensitive: true,
            ..route("/billing/", "billing")
        }],
        ..ProxyConfig::default()
    })
}

/// (class, scope) or the error's reason.
fn outcome(c: &Classifier, method: &str, uri: &str, headers: &[(&str, &str)]) -> String {
    match c.classify(&head(method, uri, headers)) {
        Ok(d) => format!("{} {}", d.class.label(), d.scope),
        Err(e) => format!("{} {}", e.status().as_u16(), e.reason()),
    }
}

/// Goal: the normaliser decodes exactly the unreserved characters, removes dot segments,
/// collapses slashes, and refuses every input whose meaning depends on the decoder.
/// Method: a table of raw paths (hostile ones included) and their normal form or refusal.
#[test]
fn normaliser_table() {
    let ok = [
        ("/", "/"),
        ("/a/b", "/a/b"),
        ("/%62illing/a", "/billing/a"),
        ("/%7Euser/%2d%2E%5f", "/~user/-._"),
        ("//billing/a", "/billing/a"),
        ("/a//b///c/", "/a/b/c/"),
        ("/x/../billing/a", "/billing/a"),
        ("/./billing/a", "/billing/a"),
        ("/a/./b", "/a/b"),
        ("/a/b/..", "/a/"),
        ("/a/.", "/a/"),
        ("/a/%2e%2E/b", "/b"),
        ("/a%20b/%3a", "/a%20b/%3A"),
        ("/caf%c3%a9", "/caf%C3%A9"),
        ("/...", "/..."),
        ("/a;b/c", "/a;b/c"),
    ];
    for (raw, want) in ok {
        assert_eq!(normalise(raw).unwrap(), want, "{raw}");
    }
    let refused = [
        "/billing%2Fa",
        "/billing%2fa",
        "/a%5Cb",
        "/a\\b",
        "/a%00",
        "/a%0A",
        "/a%7F",
        "/a%zz",
        "/a%4",
        "/a%",
        "/a%+1",
        "/..",
        "/%2e%2e/billing/a",
        "/a/../../b",
        "/%2E%2E",
        "/x/..;/billing/a",
        "/x/.;y/a",
        "/%C0%AF",
        "/%C3",
        "/%ff%fe",
        "a/b",
        "",
    ];
    for raw in refused {
        let err = normalise(raw).unwrap_err();
        assert_eq!(err.reason(), "bad-path", "{raw}");
        assert_eq!(err.status(), http::StatusCode::BAD_REQUEST, "{raw}");
    }
}

/// Goal: the bypass spellings of a routed path either land in the route's scope or are
/// refused; none falls into `default`.
/// Method: classify each spelling against a case-insensitive `/billing/` route.
#[test]
fn bypass_spellings_never_escape_their_route() {
    let c = billing();
    let cases = [
        ("/billing/a", "write billing"),
        ("/%62illing/a", "write billing"),
        ("/BILLING/a", "write billing"),
        ("/BiLlInG/a", "write billing"),
        // The literal reading (no dot removal) falls in `default`: ambiguous.
        ("//billing/a", "400 bad-path"),
        ("/x/../billing/a", "400 bad-path"),
        ("/./billing/a", "400 bad-path"),
        ("/billing/x/../../a", "400 bad-path"),
        ("/billing%2Fa", "400 bad-path"),
        ("/%2e%2e/billing/a", "400 bad-path"),
        ("/billing/..;/a", "400 bad-path"),
        // Inside the route, every reading agrees.
        ("/billing//a", "write billing"),
        ("/billing/x/../a", "write billing"),
        ("/other", "write default"),
        // The directory itself is in its route; a sibling with the same start is not.
        ("/billing", "write billing"),
        ("/Billing", "write billing"),
        ("/billingX/a", "write default"),
        ("/billing.old", "write default"),
        ("/a/./b", "write default"),
    ];
    for (uri, want) in cases {
        assert_eq!(outcome(&c, "PUT", uri, &[]), want, "{uri}");
    }
    // Case-sensitive routes stay case-sensitive.
    let strict = classifier(&ProxyConfig {
        routes: vec![route("/billing/", "billing")],
        ..ProxyConfig::default()
    });
    assert_eq!(outcome(&strict, "PUT", "/BILLING/a", &[]), "write default");
    assert_eq!(outcome(&strict, "PUT", "/BILLING", &[]), "write default");
    // A prefix without a trailing slash is a plain string prefix.
    let plain = classifier(&ProxyConfig {
        routes: vec![route("/billing", "billing")],
        ..ProxyConfig::default()
    });
    assert_eq!(outcome(&plain, "PUT", "/billingX/a", &[]), "write billing");
    assert_eq!(outcome(&plain, "PUT", "/billin", &[]), "write default");
    // The root route's "directory" is not the empty path.
    let root = classifier(&ProxyConfig {
        routes: vec![route("/", "all")],
        ..ProxyConfig::default()
    });
    assert_eq!(outcome(&root, "PUT", "/", &[]), "write all");
    assert_eq!(outcome(&root, "PUT", "/x", &[]), "write all");
    // An absolute-form target without a path is the root.
    assert_eq!(
        outcome(&c, "PUT", "http://example.com", &[]),
        "write default"
    );
    // Absolute-form (and HTTP/2) targets are routed by their path.
    assert_eq!(
        outcome(&c, "PUT", "http://example.com/%62illing/a", &[]),
        "write billing"
    );
}

/// Goal: reads are exactly the read methods; every other method, any case, any
/// extension, is a write; CONNECT is refused.
/// Method: classify a table of methods with the default configuration.
#[test]
fn methods_fail_closed() {
    let c = classifier(&ProxyConfig::default());
    for m in ["GET", "HEAD", "OPTIONS"] {
        assert_eq!(outcome(&c, m, "/k", &[]), "read default", "{m}");
    }
    for m in [
        "PUT",
        "POST",
        "DELETE",
        "PATCH",
        "TRACE",
        "get",
        "put",
        "Get",
        "MOVE",
        "COPY",
        "MKCOL",
        "PROPPATCH",
        "PROPFIND",
        "LOCK",
        "UNLOCK",
        "PURGE",
        "FROB",
        "connect",
    ] {
        assert_eq!(outcome(&c, m, "/k", &[]), "write default", "{m}");
    }
    assert_eq!(
        outcome(&c, "CONNECT", "example.com:443", &[]),
        "405 tunnel-refused"
    );
    assert_eq!(outcome(&c, "OPTIONS", "*", &[]), "read default");
    assert_eq!(outcome(&c, "GET", "*", &[]), "400 bad-path");
    // read_methods is configurable: a WebDAV set-up reads with PROPFIND.
    let dav = classifier(&ProxyConfig {
        read_methods: ["GET", "HEAD", "OPTIONS", "PROPFIND"]
            .map(String::from)
            .into(),
        ..ProxyConfig::default()
    });
    assert_eq!(outcome(&dav, "PROPFIND", "/d/", &[]), "read default");
    assert_eq!(outcome(&dav, "propfind", "/d/", &[]), "write default");
}

/// Goal: a method override is classified by the method it names, never downgrades a
/// write, and is refused when repeated or unparsable.
/// Method: classify GETs and POSTs with override headers.
#[test]
fn method_overrides_take_the_stricter_method() {
    let c = classifier(&ProxyConfig::default());
    let o = "X-HTTP-Method-Override";
    assert_eq!(outcome(&c, "GET", "/k", &[(o, "DELETE")]), "write default");
    assert_eq!(
        outcome(&c, "GET", "/k", &[("x-method-override", "PUT")]),
        "write default"
    );
    assert_eq!(
        outcome(&c, "GET", "/k", &[("X-HTTP-Method", "get")]),
        "write default"
    );
    assert_eq!(outcome(&c, "GET", "/k", &[(o, "GET")]), "read default");
    assert_eq!(outcome(&c, "POST", "/k", &[(o, "GET")]), "write default");
    assert_eq!(
        outcome(&c, "GET", "/k", &[(o, "GET"), (o, "DELETE")]),
        "400 bad-request"
    );
    assert_eq!(
        outcome(&c, "GET", "/k", &[(o, "GET"), ("X-HTTP-Method", "GET")]),
        "400 bad-request"
    );
    assert_eq!(
        outcome(&c, "GET", "/k", &[(o, "DE LETE")]),
        "400 bad-request"
    );
    assert_eq!(outcome(&c, "GET", "/k", &[(o, "")]), "400 bad-request");
    // With no override headers configured, the header is just a header.
    let none = classifier(&ProxyConfig {
        method_override_headers: Vec::new(),
        ..ProxyConfig::default()
    });
    assert_eq!(
        outcome(&none, "GET", "/k", &[(o, "DELETE")]),
        "read default"
    );
}

/// Goal: a route's class overrides the method, and an upgrade is refused unless its
/// route allows it, then fenced unless the route is a read.
/// Method: classify POSTs on a read route, GETs on a write route, and upgrades.
#[test]
fn route_classes_and_upgrades() {
    let c = classifier(&ProxyConfig {
        routes: vec![
            Route {
                class: Some(RouteClass::Read),
                ..route("/v3/kv/range", "etcd")
            },
            Route {
                class: Some(RouteClass::Write),
                ..route("/jobs/", "jobs")
            },
            Route {
                upgrade: true,
                ..route("/ws/", "ws")
            },
            Route {
                upgrade: true,
                class: Some(RouteClass::Read),
                ..route("/feed/", "feed")
            },
        ],
        ..ProxyConfig::default()
    });
    assert_eq!(outcome(&c, "POST", "/v3/kv/range", &[]), "read etcd");
    assert_eq!(outcome(&c, "POST", "/v3/kv/put", &[]), "write default");
    assert_eq!(outcome(&c, "GET", "/jobs/1", &[]), "write jobs");
    // The range route must not be reachable by a spelling that only one reading takes there.
    assert_eq!(
        outcome(&c, "POST", "/v3/kv/range/../put", &[]),
        "400 bad-path"
    );
    let up = [("Upgrade", "websocket"), ("Connection", "Upgrade")];
    assert_eq!(outcome(&c, "GET", "/k", &up), "405 tunnel-refused");
    assert_eq!(outcome(&c, "GET", "/ws/chat", &up), "write ws");
    assert_eq!(outcome(&c, "GET", "/feed/x", &up), "read feed");
    // An h2c offer is ignored, alone; with another protocol it is an upgrade.
    let h2c = [
        ("Upgrade", "h2c"),
        ("Connection", "Upgrade, HTTP2-Settings"),
    ];
    assert_eq!(outcome(&c, "GET", "/k", &h2c), "read default");
    assert!(!c.classify(&head("GET", "/k", &h2c)).unwrap().upgrade);
    assert_eq!(
        outcome(&c, "GET", "/k", &[("Upgrade", "h2c, websocket")]),
        "405 tunnel-refused"
    );
    assert_eq!(
        outcome(&c, "GET", "/k", &[("Upgrade", "")]),
        "405 tunnel-refused"
    );
    let d = c.classify(&head("GET", "/ws/chat", &up)).unwrap();
    assert!(d.upgrade);
    assert!(!c.classify(&head("GET", "/ws/chat", &[])).unwrap().upgrade);
    assert_eq!(
        outcome(&c, "CONNECT", "example.com:443", &[]),
        "405 tunnel-refused"
    );
    // HTTP/2 extended CONNECT is an upgrade.
    let mut h2 = head("CONNECT", "http://h/k", &[]);
    h2.extensions
        .insert(hyper::ext::Protocol::from_static("websocket"));
    assert_eq!(c.classify(&h2).unwrap_err().reason(), "tunnel-refused");
    let mut h2 = head("CONNECT", "http://h/ws/x", &[]);
    h2.extensions
        .insert(hyper::ext::Protocol::from_static("websocket"));
    assert_eq!(c.classify(&h2).unwrap().class, Class::Write);
}

/// Goal: `scope_segment` takes the scope from a path segment, refuses a fenced request
/// with no usable segment, and lets an unfenced read without one through.
/// Method: an S3-style route `/` with `scope_segment = 1`.
#[test]
fn scope_segment_gives_each_bucket_its_scope() {
    let c = classifier(&ProxyConfig {
        routes: vec![Route {
            prefix: "/".into(),
            scope_segment: Some(1),
            ..Route::default()
        }],
        ..ProxyConfig::default()
    });
    assert_eq!(outcome(&c, "PUT", "/photos/a/b", &[]), "write photos");
    assert_eq!(outcome(&c, "PUT", "/photos", &[]), "write photos");
    assert_eq!(outcome(&c, "PUT", "/%70hotos/a", &[]), "write photos");
    // A key starting with / (an empty segment) stays in its bucket in every reading.
    assert_eq!(outcome(&c, "PUT", "/photos//a", &[]), "write photos");
    assert_eq!(outcome(&c, "PUT", "/", &[]), "400 bad-scope");
    assert_eq!(outcome(&c, "PUT", "/bad%20name/k", &[]), "400 bad-scope");
    assert_eq!(outcome(&c, "PUT", "/x/../photos/k", &[]), "400 bad-path");
    assert_eq!(outcome(&c, "GET", "/", &[]), "read default");
    let err = c.classify(&head("PUT", "/", &[])).unwrap_err();
    assert!(err.to_string().contains("scope_segment = 1"), "{err}");
    let fence_reads = classifier(&ProxyConfig {
        fence_reads: true,
        ..ProxyConfig {
            routes: vec![Route {
                prefix: "/".into(),
                scope_segment: Some(2),
                ..Route::default()
            }],
            ..ProxyConfig::default()
        }
    });
    assert_eq!(outcome(&fence_reads, "GET", "/a/b", &[]), "read b");
    assert_eq!(outcome(&fence_reads, "GET", "/a", &[]), "400 bad-scope");
}

/// Goal: client-chosen scopes are off by default, and when on, a route restricts them
/// to its prefix or to its own scope.
/// Method: classify requests with `Fencing-Scope` under both settings.
#[test]
fn client_scopes_are_off_by_default_and_bounded_by_routes() {
    let off = billing();
    let s = "Fencing-Scope";
    assert_eq!(outcome(&off, "PUT", "/k", &[(s, "other")]), "400 bad-scope");
    let err = off
        .classify(&head("PUT", "/k", &[(s, "other")]))
        .unwrap_err();
    assert!(err.to_string().contains("--client-scopes"), "{err}");
    assert_eq!(
        outcome(&off, "PUT", "/billing/a", &[(s, "billing")]),
        "write billing"
    );
    assert_eq!(
        outcome(&off, "PUT", "/billing/a", &[(s, "other")]),
        "400 bad-scope"
    );
    assert_eq!(
        outcome(&off, "PUT", "/k", &[(s, "a"), (s, "a")]),
        "400 bad-scope"
    );
    // Naming the scope the proxy would pick anyway is not a choice.
    assert_eq!(
        outcome(&off, "PUT", "/k", &[(s, "default")]),
        "write default"
    );
    assert_eq!(
        outcome(&off, "PUT", "/billing/a", &[(s, "default")]),
        "400 bad-scope"
    );
    // Reads too: a client that chose a scope is told at once, not at its first write.
    assert_eq!(outcome(&off, "GET", "/k", &[(s, "other")]), "400 bad-scope");
    assert_eq!(
        outcome(&off, "GET", "/billing/a", &[(s, "other")]),
        "400 bad-scope"
    );
    assert_eq!(
        outcome(&off, "OPTIONS", "*", &[(s, "other")]),
        "400 bad-scope"
    );

    let on = classifier(&ProxyConfig {
        client_scopes: true,
        routes: vec![
            route("/billing/", "billing"),
            Route {
                client_scope_prefix: Some("team-".into()),
                ..route("/teams/", "teams")
            },
        ],
        ..ProxyConfig::default()
    });
    assert_eq!(outcome(&on, "PUT", "/k", &[(s, "jobs")]), "write jobs");
    assert_eq!(
        outcome(&on, "PUT", "/k", &[(s, "bad scope!")]),
        "400 bad-scope"
    );
    assert_eq!(
        outcome(&on, "PUT", "/billing/a", &[(s, "jobs")]),
        "400 bad-scope"
    );
    assert_eq!(
        outcome(&on, "PUT", "/teams/x", &[(s, "team-a")]),
        "write team-a"
    );
    assert_eq!(
        outcome(&on, "PUT", "/teams/x", &[(s, "other")]),
        "400 bad-scope"
    );
    assert_eq!(outcome(&on, "PUT", "/teams/x", &[]), "write teams");
}

/// Goal: `default` and every fixed route scope are reserved, once each.
/// Method: list the reserved scopes of a config with a repeated scope and a segment route.
#[test]
fn reserved_scopes_are_default_and_route_scopes() {
    let c = classifier(&ProxyConfig {
        routes: vec![
            route("/a/", "x"),
            route("/b/", "x"),
            route("/c/", "default"),
            Route {
                prefix: "/s3/".into(),
                scope_segment: Some(2),
                ..Route::default()
            },
        ],
        ..ProxyConfig::default()
    });
    assert_eq!(
        c.reserved_scopes(),
        vec!["default".to_owned(), "x".to_owned()]
    );
}

/// Goal: the fast path for plain paths changes no decision: every path it takes has the
/// path itself as its only reading, and the paths it declines still go through the full
/// rules.
/// Method: compare the fast answer with the full readings for plain paths, including a
/// root, a trailing slash and dots inside segment names; check that paths with encoding,
/// empty or dot segments, parameters or backslashes are declined.
#[test]
fn plain_paths_take_the_fast_path_with_the_same_readings() {
    for plain in [
        "/",
        "/a",
        "/billing/",
        "/billing/a",
        "/bucket/key.tar.gz",
        "/a/.hidden/..x/b.",
        "/v3/kv/range",
        "/x/y/z/",
    ] {
        assert!(is_plain(plain), "{plain} should be plain");
        let full = all_readings(plain).unwrap();
        assert_eq!(full, vec![plain.to_owned()], "{plain}");
        assert_eq!(readings(plain).unwrap(), full, "{plain}");
    }
    for not_plain in [
        "",
        "a/b",
        "//a",
        "/a//b",
        "/./a",
        "/a/..",
        "/a/../b",
        "/%62illing",
        "/a;x",
        "/a\\b",
        "/a b",
        "*",
        "/..",
        "/a/.",
        "/a//",
        "/a/\u{e9}",
    ] {
        assert!(!is_plain(not_plain), "{not_plain:?} should not be plain");
    }
}

/// Goal: a decision carries whether its route lets GET and HEAD carry a body
/// (`read_bodies`), which is off everywhere else, `default` included.
/// Method: classify a GET under a route with `read_bodies = true`, under one without,
/// and outside both.
#[test]
fn read_bodies_comes_from_the_route() {
    let c = classifier(&ProxyConfig {
        routes: vec![
            Route {
                read_bodies: true,
                ..route("/search/", "search")
            },
            route("/billing/", "billing"),
        ],
        ..ProxyConfig::default()
    });
    let decide = |uri| c.classify(&head("GET", uri, &[])).unwrap().read_bodies;
    assert!(decide("/search/q"));
    assert!(!decide("/billing/a"));
    assert!(!decide("/other"));
}
