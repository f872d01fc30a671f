//! The configuration's unit tests: defaults, parsing, and errors that name their field.

use std::net::SocketAddr;

use super::*;

/// Goal: a proxy started with no file at all has a valid configuration.
/// Method: validate the defaults and read back the default addresses.
#[test]
fn defaults_are_valid() {
    let c = ProxyConfig::default();
    c.validate().unwrap();
    assert_eq!(c.listen.to_string(), LISTEN_DEFAULT);
    assert_eq!(c.admin_listen.to_string(), ADMIN_LISTEN_DEFAULT);
}

/// Goal: the audit log's settings read from TOML, and a size limit below
/// `AUDIT_LOG_BYTES_MIN` is refused naming `audit_log_bytes_max`.
/// Method: parse a file with the three fields; validate, then shrink the limit.
#[test]
fn audit_log_settings_parse_and_a_tiny_limit_is_refused() {
    let mut c = toml::from_str::<ProxyConfig>(
        "audit_log = \"/var/log/p.audit\"\naudit_log_bytes_max = 4096\naudit_log_keep = 2\n",
    )
    .unwrap();
    assert_eq!(
        (
            c.audit_log.as_deref(),
            c.audit_log_bytes_max,
            c.audit_log_keep
        ),
        (Some(std::path::Path::new("/var/log/p.audit")), 4096, 2)
    );
    c.validate().unwrap();
    c.audit_log_bytes_max = AUDIT_LOG_BYTES_MIN - 1;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("audit_log_bytes_max"), "{err}");
}

/// Goal: a misspelt field is an error naming it, not silently ignored.
/// Method: parse TOML with `listn`.
#[test]
fn unknown_field_is_refused_by_name() {
    let err = toml::from_str::<ProxyConfig>("listn = \"127.0.0.1:1\"").unwrap_err();
    assert!(err.to_string().contains("listn"), "{err}");
}

/// Goal: a bad value is refused with the field it is in, and route scopes follow the
/// protocol's one scope rule.
/// Method: validate configs with a small header limit, bad and over-long route
/// scopes, and a non-HTTP upstream.
#[test]
fn bad_values_name_their_field() {
    let mut c = ProxyConfig::default();
    c.limits.header_bytes_max = 100;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("limits.header_bytes_max"), "{err}");

    // No write timeout at all would let a client that reads nothing hold its
    // connection for ever; 0 is refused, not taken as "none".
    let mut c = ProxyConfig::default();
    c.limits.client_write_timeout_ms = 0;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("limits.client_write_timeout_ms"), "{err}");

    let c = ProxyConfig {
        routes: vec![Route {
            prefix: "/a".into(),
            scope: Some("bad scope".into()),
            ..Route::default()
        }],
        ..ProxyConfig::default()
    };
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("routes[0].scope"), "{err}");
    let c = ProxyConfig {
        routes: vec![Route {
            prefix: "/a".into(),
            scope: Some("x".repeat(palisade_protocol::SCOPE_BYTES_MAX + 1)),
            ..Route::default()
        }],
        ..ProxyConfig::default()
    };
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("routes[0].scope") && err.contains("129 bytes"),
        "{err}"
    );

    for (prefix, want) in [
        ("/%62illing/", "\"/billing/\""),
        ("//a", "\"/a\""),
        ("/a%2Fb", "never match"),
    ] {
        let c = ProxyConfig {
            routes: vec![Route {
                prefix: prefix.into(),
                scope: Some("a".into()),
                ..Route::default()
            }],
            ..ProxyConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("routes[0].prefix") && err.contains(want),
            "{err}"
        );
    }

    let c = ProxyConfig {
        upstream: Some("ftp://x".into()),
        ..ProxyConfig::default()
    };
    assert!(c.validate().unwrap_err().to_string().contains("upstream"));
}

/// Goal: the fleet fields are checked and their errors name the field: node URLs,
/// duplicates, fleet settings without a cluster, half a client certificate.
/// Method: validate configs with each mistake, then a good one and its fleet name.
#[test]
fn fleet_fields_name_their_field() {
    let fleet = |f: fn(&mut ProxyConfig)| {
        let mut c = ProxyConfig {
            cluster: vec!["http://127.0.0.1:7001".into()],
            ..ProxyConfig::default()
        };
        f(&mut c);
        c.validate().err().map(|e| e.to_string())
    };
    assert_eq!(fleet(|_| {}), None);
    let err = fleet(|c| c.cluster.push("ftp://x".into())).unwrap();
    assert!(err.contains("cluster[1]"), "{err}");
    let err = fleet(|c| c.cluster.push("http://127.0.0.1:7001".into())).unwrap();
    assert!(err.contains("cluster[1]") && err.contains("twice"), "{err}");
    let err = fleet(|c| c.fleet_name = Some("nope".into())).unwrap();
    assert!(err.contains("fleet_name"), "{err}");
    let err = fleet(|c| {
        c.cluster_tls = Some(ClusterTlsConfig {
            cert: Some("c.pem".into()),
            ..ClusterTlsConfig::default()
        });
    })
    .unwrap();
    assert!(err.contains("cluster_tls.cert"), "{err}");
    let err = fleet(|c| c.limits.lease_renew_timeout_ms = 0).unwrap();
    assert!(err.contains("limits.lease_renew_timeout_ms"), "{err}");
    let err = fleet(|c| c.lease_write_bound_ms = 0).unwrap();
    assert!(err.contains("lease_write_bound_ms"), "{err}");
    let standalone = ProxyConfig {
        fleet_name: Some("http://p1".into()),
        ..ProxyConfig::default()
    };
    let err = standalone.validate().unwrap_err().to_string();
    assert!(
        err.contains("fleet_name") && err.contains("cluster is empty"),
        "{err}"
    );
    let admin: SocketAddr = "127.0.0.1:9001".parse().unwrap();
    assert_eq!(
        ProxyConfig::default().fleet_name_for(admin),
        "http://127.0.0.1:9001"
    );
}

/// Goal: the limits that keep slow bodies from holding upstream slots read from TOML
/// with their defaults (10 s to arrive; half the slots for streams without a token),
/// and a zero, or more streams than slots, is refused naming the field; `read_bodies`
/// is off unless a route sets it.
/// Method: parse a file with each field, validate, then break each.
#[test]
fn body_arrival_and_unfenced_stream_limits_parse_and_are_checked() {
    let defaults = Limits::default();
    assert_eq!(defaults.body_arrival_timeout_ms, 10_000);
    assert_eq!(defaults.unfenced_streams_max(), 128);
    let mut c = toml::from_str::<ProxyConfig>(
        "[limits]\nbody_arrival_timeout_ms = 500\nunfenced_streams_max = 3\n\
         upstream_requests_max = 4\n\n[[routes]]\nprefix = \"/search/\"\nscope = \"s\"\n\
         read_bodies = true\n",
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(c.limits.body_arrival_timeout_ms, 500);
    assert_eq!(c.limits.unfenced_streams_max(), 3);
    assert!(c.routes[0].read_bodies);
    assert!(!Route::default().read_bodies);

    c.limits.unfenced_streams_max = Some(5);
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("limits.unfenced_streams_max") && err.contains("upstream_requests_max (4)"),
        "{err}"
    );
    c.limits.unfenced_streams_max = Some(0);
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("limits.unfenced_streams_max"), "{err}");
    c.limits.unfenced_streams_max = None;
    c.limits.upstream_requests_max = 1;
    assert_eq!(c.limits.unfenced_streams_max(), 1, "at least one");
    c.limits.body_arrival_timeout_ms = 0;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("limits.body_arrival_timeout_ms"), "{err}");
}

/// Goal: the data-path threads default to one per worker of the runtime the proxy starts
/// in, `reuseport_threads = 0` turns them off, and a number is taken as it is.
/// Method: a runtime of 3 workers; the default, 0 and 5 from TOML.
#[test]
fn data_threads_default_to_the_runtime_workers() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(3)
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let default = ProxyConfig::from_toml_str("").unwrap();
    assert_eq!(default.reuseport_threads, None);
    assert_eq!(default.data_threads(), 3);
    let off = ProxyConfig::from_toml_str("reuseport_threads = 0").unwrap();
    assert_eq!(off.data_threads(), 0);
    let five = ProxyConfig::from_toml_str("reuseport_threads = 5").unwrap();
    assert_eq!(five.data_threads(), 5);
    let too_many = ProxyConfig::from_toml_str("reuseport_threads = 257").unwrap();
    assert!(too_many.validate().is_err());
}

/// Goal: `upstream_http1_client` defaults to the proxy's own exchange, takes `hyper`,
/// and refuses anything else naming the field and the two values.
/// Method: parse files without it, with each value, and with a misspelt one.
#[test]
fn the_upstream_http1_client_is_own_unless_hyper_is_named() {
    assert_eq!(
        ProxyConfig::default().upstream_http1_client,
        Http1Client::Own
    );
    let parse = |text: &str| toml::from_str::<ProxyConfig>(text);
    assert_eq!(
        parse("upstream_http1_client = \"own\"")
            .unwrap()
            .upstream_http1_client,
        Http1Client::Own
    );
    assert_eq!(
        parse("upstream_http1_client = \"hyper\"")
            .unwrap()
            .upstream_http1_client,
        Http1Client::Hyper
    );
    let err = parse("upstream_http1_client = \"nginx\"")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("upstream_http1_client") && err.contains("own") && err.contains("hyper"),
        "{err}"
    );
}
