//! Which master to follow when the sentinels asked name more than one: the rule every
//! client applies to the same answers, so that every process of one URL follows the
//! same node.
//!
//! The highest configuration epoch first (`config-epoch` in `SENTINEL MASTER`: Sentinel
//! itself takes the configuration of the highest epoch as the current one), then the
//! master most sentinels name, then the lowest address (its IP address or host name as
//! text, then its port), which nothing else decides but which every client reads the
//! same.

use std::sync::Mutex;

use super::Address;

/// What one sentinel said of the master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Answer {
    /// The sentinel's place in the URL's list.
    pub sentinel: usize,
    pub master: Address,
    /// The configuration epoch it holds for that master.
    pub epoch: u64,
    /// Whether it says the master is up: flagged a master, and neither subjectively
    /// nor objectively down.
    pub up: bool,
}

/// A master the sentinels named, with what ranks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Candidate {
    pub master: Address,
    /// The highest epoch a sentinel gave for it.
    pub epoch: u64,
    /// How many sentinels named it.
    pub votes: usize,
    /// Whether one of them says it is up.
    pub up: bool,
}

/// The masters `answers` name, the one to follow first: highest epoch, then most
/// sentinels, then lowest address.
pub(super) fn ranked(answers: &[Answer]) -> Vec<Candidate> {
    let mut candidates: Vec<Candidate> = Vec::new();
    for answer in answers {
        match candidates.iter_mut().find(|c| c.master == answer.master) {
            Some(candidate) => {
                candidate.epoch = candidate.epoch.max(answer.epoch);
                candidate.votes += 1;
                candidate.up |= answer.up;
            }
            None => candidates.push(Candidate {
                master: answer.master.clone(),
                epoch: answer.epoch,
                votes: 1,
                up: answer.up,
            }),
        }
    }
    candidates.sort_by(|a, b| {
        b.epoch
            .cmp(&a.epoch)
            .then(b.votes.cmp(&a.votes))
            .then_with(|| a.master.cmp(&b.master))
    });
    candidates
}

/// Whether the answers name more than one master as up: sentinels that disagree. (One
/// that says its master is down points no client there; during a failover that is
/// the old master, for a moment.)
pub(super) fn disagree(answers: &[Answer]) -> bool {
    let mut up = answers.iter().filter(|a| a.up).map(|a| &a.master);
    match up.next() {
        Some(first) => up.any(|other| other != first),
        None => false,
    }
}

/// `host:port`, with brackets around an IPv6 address.
pub(super) fn shown(address: &Address) -> String {
    let (host, port) = address;
    // (a sentinel's reply names the host: no line of the log is its to write)
    let host = host.escape_debug();
    if address.0.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// What the sentinels said, one `sentinel named master (config epoch N)` each, in the
/// URL's order: addresses and epochs, never a credential.
pub(super) fn described(answers: &[Answer], sentinels: &[Address]) -> String {
    let mut answers: Vec<&Answer> = answers.iter().collect();
    answers.sort_by_key(|a| a.sentinel);
    let said: Vec<String> = answers
        .iter()
        .map(|a| {
            let sentinel = sentinels.get(a.sentinel).map(shown).unwrap_or_default();
            let down = if a.up { "" } else { ", down" };
            format!(
                "sentinel {sentinel} named {} (config epoch {}{down})",
                shown(&a.master),
                a.epoch
            )
        })
        .collect();
    said.join("; ")
}

/// The disagreements already logged by this process (one per master name and what its
/// sentinels said), the oldest forgotten past [`WARNED_KEPT`].
static WARNED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// How many disagreements are remembered, so that each is logged once.
const WARNED_KEPT: usize = 64;

/// Whether this process has yet to log the disagreement `key`: true once per key, for
/// every client of the process (a search repeated while the sentinels disagree, or
/// twenty clients of one URL, log it once).
pub(super) fn first_time(key: &str) -> bool {
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if warned.iter().any(|k| k == key) {
        return false;
    }
    if warned.len() >= WARNED_KEPT {
        warned.remove(0);
    }
    warned.push(key.to_owned());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(sentinel: usize, port: u16, epoch: u64, up: bool) -> Answer {
        Answer {
            sentinel,
            master: ("10.0.0.1".to_owned(), port),
            epoch,
            up,
        }
    }

    fn order(answers: &[Answer]) -> Vec<u16> {
        ranked(answers).iter().map(|c| c.master.1).collect()
    }

    #[test]
    fn the_highest_epoch_comes_first_whatever_the_votes() {
        let answers = [
            answer(0, 6379, 3, true),
            answer(1, 6379, 3, true),
            answer(2, 6380, 4, true),
        ];
        assert_eq!(order(&answers), [6380, 6379]);
        // In any order of answers.
        let mut reversed = answers.to_vec();
        reversed.reverse();
        assert_eq!(order(&reversed), [6380, 6379]);
    }

    #[test]
    fn equal_epochs_go_to_the_most_sentinels_then_the_lowest_address() {
        let answers = [
            answer(0, 6379, 2, true),
            answer(1, 6381, 2, true),
            answer(2, 6381, 2, true),
        ];
        assert_eq!(order(&answers), [6381, 6379]);
        let answers = [answer(0, 6381, 2, true), answer(1, 6379, 2, true)];
        assert_eq!(order(&answers), [6379, 6381]);
        let mut hosts = [answer(0, 1, 0, true), answer(1, 9, 0, true)];
        hosts[0].master.0 = "10.0.0.2".into();
        assert_eq!(
            ranked(&hosts)[0].master,
            ("10.0.0.1".to_owned(), 9),
            "the host's text first, then the port"
        );
    }

    #[test]
    fn a_candidate_holds_its_highest_epoch_its_votes_and_whether_one_says_up() {
        let answers = [
            answer(0, 6379, 1, false),
            answer(1, 6379, 2, true),
            answer(2, 6380, 1, true),
        ];
        assert_eq!(
            ranked(&answers)[0],
            Candidate {
                master: ("10.0.0.1".to_owned(), 6379),
                epoch: 2,
                votes: 2,
                up: true,
            }
        );
    }

    #[test]
    fn a_host_a_sentinel_names_cannot_write_a_line_of_the_log() {
        let host = "10.0.0.1\nERROR forged\u{1b}[31m".to_owned();
        let text = shown(&(host, 6379));
        assert!(!text.chars().any(char::is_control), "{text}");
        assert_eq!(text, "10.0.0.1\\nERROR forged\\u{1b}[31m:6379");
    }

    #[test]
    fn only_masters_named_up_disagree() {
        assert!(!disagree(&[]));
        assert!(!disagree(&[answer(0, 6379, 1, true), answer(1, 6379, 1, true)]));
        // The old master, down, beside the new one: a failover under way.
        assert!(!disagree(&[answer(0, 6379, 1, false), answer(1, 6380, 2, true)]));
        assert!(disagree(&[answer(0, 6379, 1, true), answer(1, 6380, 2, true)]));
    }

    #[test]
    fn a_description_names_sentinels_masters_and_epochs() {
        let sentinels = [("::1".to_owned(), 26379), ("s2".to_owned(), 26380)];
        let text = described(&[answer(1, 6380, 7, false), answer(0, 6379, 3, true)], &sentinels);
        assert_eq!(
            text,
            "sentinel [::1]:26379 named 10.0.0.1:6379 (config epoch 3); \
             sentinel s2:26380 named 10.0.0.1:6380 (config epoch 7, down)"
        );
    }

    #[test]
    fn each_disagreement_is_logged_once() {
        let key = "choice-test-once 10.0.0.1:6379";
        assert!(first_time(key));
        assert!(!first_time(key));
        // Different answers (another description of the disagreement): logged again.
        let other = "choice-test-once 10.0.0.2:6379";
        assert!(first_time(other));
        assert!(!first_time(other));
        for i in 0..WARNED_KEPT {
            first_time(&format!("choice-test-filler {i}"));
        }
        // Forgotten once many others were logged after it.
        assert!(first_time(key));
    }
}
