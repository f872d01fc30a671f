//! Path normalisation and route/scope resolution of the proxy's classifier.
//!
//! A fixed configuration with routes of every kind (a scope segment, fixed scopes, a
//! nested prefix, a case-insensitive prefix, a read-only route) classifies a request
//! whose method comes from the first byte and whose target is the rest.
//!
//! Property: a request is either refused, or put in the scope that its normalised path
//! names under the routes (worked out here independently: longest prefix first, the
//! directory rule, the scope rule on the segment); never another scope. A path the
//! normaliser refuses is refused by the classifier too, and normalising is idempotent.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use palisade_proxy::ProxyConfig;
use palisade_proxy::fuzzing::{Classifier, normalise};

/// The routes under test, as an operator writes them.
const CONFIG: &str = r#"
upstream = "http://127.0.0.1:9"
[[routes]]
prefix = "/b/"
scope_segment = 2
[[routes]]
prefix = "/b/deep/"
scope = "deep"
[[routes]]
prefix = "/fixed/"
scope = "pinned"
[[routes]]
prefix = "/Ci/x/"
case_insensitive = true
scope_segment = 3
[[routes]]
prefix = "/r/"
scope = "ro"
class = "read"
"#;

/// A route as the oracle sees it.
struct Rule {
    prefix: &'static str,
    case_insensitive: bool,
    scope: Scope,
}

enum Scope {
    Fixed(&'static str),
    Segment(usize),
}

/// The same routes, longest prefix first.
const RULES: [Rule; 5] = [
    Rule {
        prefix: "/b/deep/",
        case_insensitive: false,
        scope: Scope::Fixed("deep"),
    },
    Rule {
        prefix: "/fixed/",
        case_insensitive: false,
        scope: Scope::Fixed("pinned"),
    },
    Rule {
        prefix: "/Ci/x/",
        case_insensitive: true,
        scope: Scope::Segment(3),
    },
    Rule {
        prefix: "/b/",
        case_insensitive: false,
        scope: Scope::Segment(2),
    },
    Rule {
        prefix: "/r/",
        case_insensitive: false,
        scope: Scope::Fixed("ro"),
    },
];

const METHODS: [&str; 8] = [
    "GET", "PUT", "DELETE", "POST", "HEAD", "OPTIONS", "PATCH", "MOVE",
];

static CLASSIFIER: LazyLock<Classifier> = LazyLock::new(|| {
    let config = ProxyConfig::from_toml_str(CONFIG).expect("the fixed config parses");
    config.validate().expect("the fixed config validates");
    Classifier::new(&config)
});

fn valid_scope(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn matches(rule: &Rule, path: &str) -> bool {
    let same = |a: &str, b: &str| {
        if rule.case_insensitive {
            a.eq_ignore_ascii_case(b)
        } else {
            a == b
        }
    };
    let under = path
        .get(..rule.prefix.len())
        .is_some_and(|head| same(head, rule.prefix));
    let directory = rule.prefix.len() > 1 && same(path, &rule.prefix[..rule.prefix.len() - 1]);
    under || directory
}

/// The scope the routes give the normalised `path`: `None` when its route gives none.
fn expected_scope(path: &str) -> Option<String> {
    let Some(rule) = RULES.iter().find(|r| matches(r, path)) else {
        return Some("default".to_owned());
    };
    match rule.scope {
        Scope::Fixed(name) => Some(name.to_owned()),
        Scope::Segment(n) => path
            .split('/')
            .skip(1)
            .nth(n - 1)
            .filter(|s| valid_scope(s))
            .map(str::to_owned),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, target)) = data.split_first() else {
        return;
    };
    let method = METHODS[usize::from(selector) % METHODS.len()];
    if let Ok(raw) = std::str::from_utf8(target)
        && let Ok(normal) = normalise(raw)
    {
        assert_eq!(
            normalise(&normal).as_ref(),
            Ok(&normal),
            "normalising {raw:?} twice"
        );
    }
    let Ok(uri) = http::Uri::try_from(target) else {
        return;
    };
    let Ok(request) = http::Request::builder().method(method).uri(uri).body(()) else {
        return;
    };
    let (parts, ()) = request.into_parts();
    let raw = parts.uri.path();
    let decision = CLASSIFIER.classify(&parts);
    let normal = match normalise(raw) {
        Ok(normal) => normal,
        Err(reason) => {
            assert!(
                raw == "*" || decision.is_err(),
                "{raw:?} cannot be normalised ({reason}) but was classified as {decision:?}"
            );
            return;
        }
    };
    let Ok(decision) = decision else {
        return;
    };
    match expected_scope(&normal) {
        Some(scope) => assert_eq!(
            decision.scope, scope,
            "{method} {raw:?} (normalised {normal:?}) classified into the wrong scope"
        ),
        // A route that gives no scope for this path: only an unfenced read passes, and
        // it is labelled `default`.
        None => {
            assert!(
                !decision.write,
                "{method} {raw:?} is a write without a scope: {decision:?}"
            );
            assert_eq!(decision.scope, "default", "{method} {raw:?}");
        }
    }
});
