use super::*;

/// An error reply as the connection reads it off the wire.
fn reply(line: &str) -> RedisError {
    redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
        .unwrap()
        .extract_error()
        .unwrap_err()
}

#[test]
fn an_unknown_command_is_named_without_the_arguments_the_server_echoes() {
    let err =
        reply("ERR unknown command 'HELLO', with args beginning with: '3' 'AUTH' 'default' 'S3cr3tpw' ");
    let error = script_error(&err, &[]).expect("the scripts' command unknown");
    let shown = format!("{error} {error:?}");
    assert!(shown.contains("unknown command 'HELLO'"), "{shown}");
    assert!(!shown.contains("S3cr3tpw") && !shown.contains("AUTH"), "{shown}");
}

#[test]
fn the_server_s_errors_about_itself_are_told_from_a_script_s() {
    let sha = "b3a6d5e1f4c2a7b8c9d0e1f2a3b4c5d6e7f8a9b0";
    for server_s in [
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.",
        "LOADING Redis is loading the dataset in memory",
        "ERR max number of clients reached",
        "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
        "ERR the proxy refuses this command",
    ] {
        assert!(about_the_server(&reply(server_s)), "{server_s}");
    }
    // A write refused inside the script, as Redis 7.x and Valkey, then 6.2, word it.
    for in_a_script in [
        format!("NOREPLICAS Not enough good replicas to write. script: {sha}, on @user_script:1."),
        format!("MISCONF Errors writing to the AOF file: No space left on device script: {sha}, on @user_script:1."),
        format!(
            "ERR Error running script (call to f_{sha}): @user_script:1: @user_script: 1: -NOREPLICAS Not enough good replicas to write."
        ),
    ] {
        assert!(about_the_server(&reply(&in_a_script)), "{in_a_script}");
    }
    for about_the_call in [
        format!("ERR user_script:3: attempt to compare nil with number script: {sha}, on @user_script:3."),
        format!("ERR Error running script (call to f_{sha}): @user_script:3: attempt to compare nil with number"),
        format!("WRONGTYPE Operation against a key holding the wrong kind of value script: {sha}, on @user_script:9."),
        "WRONGTYPE Operation against a key holding the wrong kind of value".to_owned(),
        "TRYAGAIN Multiple keys request during rehashing of slot".to_owned(),
        "CROSSSLOT Keys in request don't hash to the same slot".to_owned(),
        "MOVED 3999 127.0.0.1:6381".to_owned(),
        "NOSCRIPT No matching script. Please use EVAL.".to_owned(),
        "ERR unknown command 'EVALSHA', with args beginning with: 'abc' '1' 'k' ".to_owned(),
    ] {
        assert!(!about_the_server(&reply(&about_the_call)), "{about_the_call}");
    }
    let lost = RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
    assert!(!about_the_server(&lost), "no reply at all");
}

#[test]
fn outcome_replies() {
    let out = parse_outcome(&[0, 2, 150, 9, 3, 0, 0, 2, 5, 1000, 1, 0], 2).unwrap();
    assert_eq!(out.at_ms, 9);
    assert!(!out.granted);
    assert_eq!(out.refused, Some(1));
    assert_eq!(out.retry_ms, 150);
    let old = RateLimiterConfig::new(RateType::PerClient, 5, Duration::from_secs(1));
    assert_eq!(
        out.rules.to_vec(),
        vec![
            RuleOutcome {
                left: 3,
                config: ConfigChange::Kept
            },
            RuleOutcome {
                left: 0,
                config: ConfigChange::Changed(old)
            }
        ]
    );
    assert_eq!(parse_outcome(&[1, 0, 0, 9], 1), None);
    assert_eq!(
        parse_outcome(&[0, 2, 150, 9, 3, 0, 0, 2], 2),
        None,
        "the replaced config is missing"
    );
    assert_eq!(parse_outcome(&[1, 0, 0, 9, 3, 0, 7], 1), None, "a stray value");
    // The granted flag and the refusing rule agree, and the rule is the call's.
    for (flag, rule) in [(0, 3), (0, 99), (0, 0), (1, 1), (2, 0), (-1, 0), (0, -1)] {
        let reply = [flag, rule, 0, 9, 3, 0, 4, 0];
        assert_eq!(
            parse_outcome(&reply, 2),
            None,
            "granted {flag}, refused by {rule}"
        );
    }
    assert_eq!(
        parse_outcome(&[0, 2, 5, 9, 3, 0, 0, 0], 2).unwrap().refused,
        Some(1)
    );
}

#[test]
fn integer_replies_of_one_rule() {
    const M: i64 = CHECK as i64;
    let kept = |left| RuleOutcome {
        left,
        config: ConfigChange::Kept,
    };
    let grant = parse_acquire_reply(&Value::Int(5 * M + 77), 1, Some(5), Some(77)).unwrap();
    assert!(grant.granted);
    assert_eq!((grant.refused, grant.retry_ms, grant.at_ms), (None, 0, 5));
    assert_eq!(grant.rules.to_vec(), vec![kept(4)]);
    let at = 1_700_000_000_123;
    let refusal = parse_acquire_reply(&Value::Int(-(250 * M + 9)), 1, Some(at), Some(9)).unwrap();
    assert!(!refusal.granted);
    assert_eq!(
        (refusal.refused, refusal.retry_ms, refusal.at_ms),
        (Some(0), 250, at)
    );
    assert_eq!(refusal.rules.to_vec(), vec![kept(0)]);
    // Another integer, as a connection out of step would hand it: another
    // command's count (the tag itself among them: a grant is at least 2^20), or
    // the reply of the call sent before or after (its tag one less or one more),
    // whatever its time.
    for stray in [0, 1, 4, 9, -1, -250, 4 * M + 8, 4 * M + 10, -(250 * M + 8)] {
        assert_eq!(
            parse_acquire_reply(&Value::Int(stray), 1, Some(at), Some(9)),
            None,
            "{stray}"
        );
    }
    // Without a tag (a caller that sent none), the call's time modulo 2^20; the
    // reply of a call 2^20 calls away carries the tag.
    let untagged = Value::Int(-(250 * M + (at % CHECK) as i64));
    assert!(parse_acquire_reply(&untagged, 1, Some(at), None).is_some());
    let far = Value::Int(5 * M + 9 + M);
    assert!(parse_acquire_reply(&far, 1, Some(at), Some(9)).is_some());
    // Only one rule, decided at the caller's time, is answered with an integer.
    assert_eq!(
        parse_acquire_reply(&Value::Int(4 * M + 9), 2, Some(77), Some(9)),
        None
    );
    assert_eq!(
        parse_acquire_reply(&Value::Int(4 * M + 9), 1, None, Some(9)),
        None
    );
}

#[test]
fn table_replies_end_with_their_tag() {
    let kept = |left| RuleOutcome {
        left,
        config: ConfigChange::Kept,
    };
    let table = |numbers: &[i64]| Value::Array(numbers.iter().copied().map(Value::Int).collect());
    let tagged = table(&[1, 0, 0, 9, 3, 0, 700]);
    assert_eq!(
        parse_acquire_reply(&tagged, 1, None, Some(700))
            .unwrap()
            .rules
            .to_vec(),
        vec![kept(3)]
    );
    // Another call's tag, no tag, a tag where a rule's field was: another reply.
    for other in [699, 701] {
        assert_eq!(
            parse_acquire_reply(&tagged, 1, None, Some(other)),
            None,
            "{other}"
        );
    }
    assert_eq!(
        parse_acquire_reply(&table(&[1, 0, 0, 9, 3, 0]), 1, None, Some(0)),
        None
    );
    assert_eq!(parse_acquire_reply(&table(&[]), 1, None, Some(0)), None);
    // Without a tag, a table as the script wrote it for a caller that sent none.
    let untagged = table(&[1, 0, 0, 9, 3, 0]);
    assert!(parse_acquire_reply(&untagged, 1, None, None).is_some());
    let text = Value::Array(vec![Value::Int(1), Value::SimpleString("0".into())]);
    assert_eq!(parse_acquire_reply(&text, 1, None, None), None);
    // A table decided at the caller's time, or up to REORDER_MS after it; another
    // time is another call's, whatever its tag.
    let decided_at_5000 = table(&[1, 0, 0, 5_000, 3, 0, 4]);
    for (caller, ok) in [
        (5_000, true),
        (4_000, true),
        (3_999, false),
        (5_001, false),
        (10_000, false),
    ] {
        let parsed = parse_acquire_reply(&decided_at_5000, 1, Some(caller), Some(4));
        assert_eq!(parsed.is_some(), ok, "the caller at {caller}");
    }
}

/// Each server's wording of one `error('redlimit:...', 0)`, and of a command's
/// error inside a script, as recorded from Redis 6.2.14, 7.0.15 and Valkey 8.1.8,
/// reads as the same code and detail.
#[test]
fn every_servers_wording_of_a_script_error() {
    let sha = "adca7d748f39278e006f8439d97469003614482a";
    let text = "permits member of 3 bytes does not decode";
    let ours = ("redlimit:bad_member:1", text);
    let v7 = format!("redlimit:bad_member:1 {text} script: {sha}, on @user_script:19.");
    let v62 =
        format!("Error running script (call to f_{sha}): @user_script:19: redlimit:bad_member:1 {text}");
    assert_eq!(unwrapped("ERR", &v7), ours, "7.x, Valkey");
    assert_eq!(unwrapped("ERR", &v62), ours, "6.2");
    assert_eq!(unwrapped("redlimit:bad_member:1", text), ours, "an error reply");
    let wrong = "Operation against a key holding the wrong kind of value";
    let w62 = format!("Error running script (call to f_{sha}): @user_script:79: WRONGTYPE {wrong}");
    assert_eq!(unwrapped("ERR", &w62), ("WRONGTYPE", wrong), "6.2");
    let w7 = format!("{wrong} script: {sha}, on @user_script:79.");
    assert_eq!(unwrapped("WRONGTYPE", &w7), ("WRONGTYPE", wrong), "7.x");
    let oom = "command not allowed when used memory > 'maxmemory'.";
    let o62 = format!("Error running script (call to f_{sha}): @user_script:1: @user_script: 1: -OOM {oom}");
    assert_eq!(unwrapped("ERR", &o62), ("OOM", oom), "6.2");
    let o7 = format!("{oom} script: {sha}, on @user_script:1.");
    assert_eq!(unwrapped("OOM", &o7), ("OOM", oom), "7.x");
    let acl = "The user executing the script can't run this command or subcommand";
    let a62 = format!("Error running script (call to f_{sha}): @user_script:1: @user_script: 1: {acl}");
    assert_eq!(unwrapped("ERR", &a62), ("ERR", acl), "6.2");
    // A value that itself holds " script: " keeps it: only the server's suffix goes.
    let odd = format!("redlimit:bad_value:1 value a script: b script: {sha}, on @user_script:5.");
    assert_eq!(
        unwrapped("ERR", &odd),
        ("redlimit:bad_value:1", "value a script: b")
    );
    // Other errors come back as they are.
    for (code, detail) in [
        ("ERR", "value is not an integer or out of range"),
        (
            "ERR",
            "Error running script (call to f_x): @user_script:1: redlimit:a:1 b",
        ),
        ("ERR", "user_script:1: redlimit:a:1 b"),
        ("OOM", "command not allowed when used memory > 'maxmemory'."),
    ] {
        assert_eq!(unwrapped(code, detail), (code, detail), "{code} {detail}");
    }
}

#[test]
fn a_quoted_stored_text_is_cut_whatever_the_server_sends() {
    let keys = [Keys::new("orders", "c1").unwrap()];
    let long = "é".repeat(50_000);
    for (line, kind) in [
        (format!("ERR redlimit:bad_bucket:1 bucket {long}"), "bucket"),
        (format!("ERR redlimit:bad_value:1 value {long}"), "value"),
        (format!("ERR redlimit:bad_config:1 rate={long}"), "config"),
    ] {
        let error = script_error(&reply(&line), &keys).expect("a script's error");
        let shown = format!("{error} {error:?}");
        assert!(shown.len() < 1_000, "{kind}: {} bytes", shown.len());
        assert!(
            shown.contains("éé...") && shown.contains("orders"),
            "{kind}: {shown}"
        );
    }
    let short = script_error(&reply("ERR redlimit:bad_bucket:1 bucket lots"), &keys).unwrap();
    assert!(
        matches!(short, Error::CorruptBucket { ref detail, .. } if detail == "lots"),
        "{short:?}"
    );
}
