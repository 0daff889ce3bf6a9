use super::*;

#[test]
fn only_a_replys_code_says_not_the_master() {
    assert!(not_the_master(
        "READONLY",
        "You can't write against a read only replica."
    ));
    assert!(not_the_master("MASTERDOWN", "Link with MASTER is down"));
    // Redis 6.2's wording of a command's error inside a script.
    let sha = "0123456789abcdef0123456789abcdef01234567";
    let detail = format!(
        "Error running script (call to f_{sha}): @user_script:1: @user_script: 1: \
         -READONLY You can't write against a read only replica."
    );
    assert!(not_the_master("ERR", &detail));
    // A script's own error quoting a stored value.
    assert!(!not_the_master(
        "redlimit:bad_bucket:1",
        "bucket READONLY You can't write"
    ));
    assert!(!not_the_master("ERR", "redlimit:bad_bucket:1 bucket READONLY"));
}
