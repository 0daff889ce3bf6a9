//! Tests of `registry.rs`.

use super::*;

/// How a rule of `rate` a minute counts, shared by every client.
fn minute_of(rate: u64) -> Counting {
    Counting {
        rate,
        interval: Duration::from_secs(60),
        mode: RateType::Overall,
        bucket: None,
    }
}

#[test]
fn shapes_overlap_only_where_a_value_can_write_the_other_rules_text() {
    let shape = |t: &str| Shape::of_template("rate_limit:", t);
    assert_eq!(
        shape("{{tenant:{t.id}}}:search").to_string(),
        "rate_limit:{tenant:{t.id}}:search"
    );
    let overlap = |a: &str, b: &str| shape(a).overlaps(&shape(b));
    assert!(overlap("login:{user}", "login:{ip}"));
    assert!(overlap("login:{user}", "login:admin"));
    assert!(overlap("a:{x}:c", "a:b:{y}"));
    assert!(!overlap("login:{ip}", "signup:{ip}"));
    assert!(!overlap("order:{id}", "order:{id}:items"));
    assert!(
        !overlap("{{t:{x}}}:a", "t:{x}:a"),
        "braces are separators of their own"
    );
    assert_eq!(
        shape("login:{ip}"),
        shape("login:{ip}"),
        "one shape: shared on purpose"
    );
    assert_ne!(shape("login:{ip}"), shape("login:{user}"));
}

#[test]
fn published_fields_read_back() {
    let window = Registered {
        name: "a|b:{x}".into(),
        permits: 3,
        bucket: None,
    };
    let bucket = Registered {
        name: "t".into(),
        permits: 1,
        bucket: Some(crate::BucketShape {
            burst: 10,
            warmup_ms: 60_000,
        }),
    };
    for (r, field) in [(window, "a|b:{x}|w:3"), (bucket, "t|b:1:10:60000")] {
        let back = from_field(field).unwrap();
        assert_eq!(
            (back.name, back.permits, back.bucket),
            (r.name, r.permits, r.bucket)
        );
    }
    assert!(from_field("x|z:1").is_none() && from_field("x").is_none() && from_field("x|b:1:2").is_none());
}

#[test]
fn rules_of_different_shapes_that_overlap_refuse_until_one_is_gone() {
    let shape = |t: &str| Shape::of_template("p:", t);
    let (a, b, c) = (0x1000usize, 0x2000usize, 0x3000usize);
    place(a, "c", &[("reg:{ip}".into(), shape("reg:{ip}"), minute_of(10))]);
    place(c, "c", &[("reg:{ip}".into(), shape("reg:{ip}"), minute_of(10))]);
    assert!(
        conflict_of(a).is_none() && conflict_of(c).is_none(),
        "one shape in two sites"
    );
    place(
        b,
        "c",
        &[("reg:{user}".into(), shape("reg:{user}"), minute_of(10))],
    );
    let error = conflict_of(b).unwrap().to_string();
    assert!(
        error.contains("reg:{user}") && error.contains("reg:{ip}"),
        "{error}"
    );
    assert!(
        conflict_of(a).is_some() && conflict_of(c).is_some(),
        "both sides refuse, whichever came first"
    );
    forget(a);
    assert!(conflict_of(b).is_some(), "c is of a's shape");
    forget(c);
    assert!(conflict_of(b).is_none(), "nothing left to overlap");
    forget(b);
}

#[test]
fn a_name_that_is_another_rules_stored_key_overlaps_it() {
    let shape = |t: &str| Shape::of_template("p:", t);
    let (a, b) = (0x5000usize, 0x6000usize);
    // a hash tag: the keys are NAME:value, NAME:permits, NAME:bucket
    place(
        a,
        "c",
        &[("{{st:{t}}}".into(), shape("{{st:{t}}}"), minute_of(10))],
    );
    place(
        b,
        "c",
        &[(
            "{{st:{t}}}:{route}".into(),
            shape("{{st:{t}}}:{route}"),
            minute_of(10),
        )],
    );
    assert!(conflict_of(a).is_some() && conflict_of(b).is_some());
    forget(a);
    forget(b);
    // in one function too
    place(
        b,
        "c",
        &[
            ("{{st:{t}}}".into(), shape("{{st:{t}}}"), minute_of(10)),
            (
                "{{st:{t}}}:{route}".into(),
                shape("{{st:{t}}}:{route}"),
                minute_of(10),
            ),
        ],
    );
    assert!(conflict_of(b).is_some());
    forget(b);
    // a per-client bucket's key and a settle's mark
    for other in ["{{st}}:bucket:{c}", "{{st}}:settled:{g}"] {
        place(a, "c", &[("{{st}}".into(), shape("{{st}}"), minute_of(10))]);
        place(b, "c", &[(other.into(), shape(other), minute_of(10))]);
        assert!(conflict_of(a).is_some() && conflict_of(b).is_some(), "{other}");
        forget(a);
        forget(b);
    }
    // without a hash tag the keys are {NAME}:..., which no name under a prefix is
    place(a, "c", &[("sk:{x}".into(), shape("sk:{x}"), minute_of(10))]);
    place(
        b,
        "c",
        &[("sk:{x}:{y}".into(), shape("sk:{x}:{y}"), minute_of(10))],
    );
    assert!(conflict_of(a).is_none() && conflict_of(b).is_none());
    let stored: Vec<String> = shape("sk:{x}")
        .stored_keys()
        .iter()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(stored[0], "{p:sk:{x}}:value");
    assert_eq!(stored[3], "{p:sk:{x}}:value:{client}");
    forget(a);
    forget(b);
}

#[test]
fn the_client_address_is_one_dimension_however_a_rule_names_it() {
    let shape = |t: &str| Shape::of_template("rate_limit:", t);
    assert_eq!(shape("login:{ip}"), shape("login:{request.client_ip}"));
    assert_eq!(
        shape("login:{request.client_ip}").to_string(),
        "rate_limit:login:{request.client_ip}",
        "shown as written"
    );
    assert_ne!(shape("login:{request.identity}"), shape("login:{ip}"));
    assert_ne!(shape("login:{request.client_ip}"), shape("login:{user}"));
    assert_eq!(shape("login:{client ip}"), shape("login:{request.client_ip}"));
    // The client address the layer read (`{client ip}`: a layer's rule keyed by it,
    // the registry's reading of an attribute's) names only a literal that is an
    // address; a parameter named `ip`, or `request` with a field, any text.
    let overlap = |a: &str, b: &str| shape(a).overlaps(&shape(b));
    assert!(!overlap("login:{client ip}", "login:all"));
    for address in ["login:10.0.0.1", "login:%3A%3A1", "login:2001%3Adb8%3A%3A/64"] {
        assert!(overlap("login:{client ip}", address), "{address}");
    }
    assert!(overlap("login:{ip}", "login:all"));
    assert!(overlap("login:{request.client_ip}", "login:all"));
    // Across sites: a literal address beside a rule keyed by the client, counting
    // differently, refuses both; `all` beside it neither.
    let (keyed, all, one) = (0x7400usize, 0x7500usize, 0x7600usize);
    place(
        keyed,
        "c",
        &[("ad".into(), shape("ad:{client ip}"), minute_of(5))],
    );
    place(all, "c", &[("ad:all".into(), shape("ad:all"), minute_of(1000))]);
    assert!(conflict_of(keyed).is_none() && conflict_of(all).is_none());
    place(
        one,
        "c",
        &[("ad:10.0.0.1".into(), shape("ad:10.0.0.1"), minute_of(1000))],
    );
    assert!(conflict_of(keyed).is_some() && conflict_of(one).is_some());
    assert!(conflict_of(all).is_none());
    for engine in [keyed, all, one] {
        forget(engine);
    }
    // A layer's rule keyed by the client address and an attribute's key naming the
    // request's: one shape, no conflict; a third rule keyed by a caller's value
    // overlaps both.
    let (layer, attribute, other) = (0x7100usize, 0x7200usize, 0x7300usize);
    place(layer, "c", &[("dim".into(), shape("dim:{ip}"), minute_of(10))]);
    place(
        attribute,
        "c",
        &[(
            "dim:{request.client_ip}".into(),
            shape("dim:{request.client_ip}"),
            minute_of(10),
        )],
    );
    assert!(conflict_of(layer).is_none() && conflict_of(attribute).is_none());
    place(
        other,
        "c",
        &[("dim:{user}".into(), shape("dim:{user}"), minute_of(10))],
    );
    let error = conflict_of(attribute).expect("overlaps `dim:{user}`").to_string();
    assert!(error.contains("dim:{user}"), "{error}");
    assert!(conflict_of(layer).is_some());
    for engine in [other, layer, attribute] {
        forget(engine);
    }
}

/// Rules of one shape at different sites share their limiters only when they count
/// them alike: a limiter keeps the config of the call that last wrote it, and a caller
/// calling each in turn would have the looser decide the stricter's calls.
#[test]
fn one_shape_at_two_sites_must_count_alike() {
    let shape = |t: &str| Shape::of_template("p:", t);
    let (a, b) = (0x8000usize, 0x9000usize);
    place(
        a,
        "c",
        &[("share:{ip}".into(), shape("share:{ip}"), minute_of(10))],
    );
    place(
        b,
        "c",
        &[("share:{ip}".into(), shape("share:{ip}"), minute_of(10))],
    );
    assert!(
        conflict_of(a).is_none() && conflict_of(b).is_none(),
        "alike: shared"
    );
    forget(b);
    place(
        b,
        "c",
        &[("share:{ip}".into(), shape("share:{ip}"), minute_of(1_000))],
    );
    assert!(
        conflict_of(a).is_some() && conflict_of(b).is_some(),
        "another rate"
    );
    forget(a);
    forget(b);
}
