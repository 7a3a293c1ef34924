//! The state machine of one key: what a call does to a key, decided from its record alone.
//!
//! Pure functions, no PostgreSQL: `records.rs` reads the record, asks here, and applies the
//! decision. So every branch has a plain `#[test]` below that runs without a server.

/// A timestamptz: microseconds since 2000-01-01 UTC, as PostgreSQL stores it.
pub type Micros = i64;

/// Who may work on a pending key.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lease {
    /// The holder of `token` owns the key until `expires_at`; after that the next claim takes over.
    /// (Every lease the extension grants has an end; one without is over.)
    Held { token: i64, expires_at: Option<Micros> },
    /// Given back by a retryable failure (the lease ended `at`, when available): the next claim
    /// takes the key at once.
    Released { at: Option<Micros> },
}

/// Where a key stands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum State {
    Pending(Lease),
    /// Settled; `token` is the last holder's (replayed to later claims).
    Completed {
        token: Option<i64>,
    },
    /// Settled for good (a terminal failure, or a poison message); `token` is the last holder's.
    Failed {
        token: Option<i64>,
    },
}

impl State {
    /// The state stored as the columns `status`, `token`, `expires_at`. None for a status this
    /// version does not know.
    pub fn from_columns(status: &str, token: Option<i64>, expires_at: Option<Micros>) -> Option<State> {
        Some(match (status, token) {
            ("pending", Some(token)) => State::Pending(Lease::Held { token, expires_at }),
            ("pending", None) => State::Pending(Lease::Released { at: expires_at }),
            ("completed", token) => State::Completed { token },
            ("failed", token) => State::Failed { token },
            _ => return None,
        })
    }

    /// The `status` column.
    pub fn status(&self) -> &'static str {
        match self {
            State::Pending(_) => "pending",
            State::Completed { .. } => "completed",
            State::Failed { .. } => "failed",
        }
    }

    /// The `token` column: the holder's, or the last holder's once settled; none once released.
    pub fn token(&self) -> Option<i64> {
        match *self {
            State::Pending(Lease::Held { token, .. }) => Some(token),
            State::Pending(Lease::Released { .. }) => None,
            State::Completed { token } | State::Failed { token } => token,
        }
    }

    /// The `expires_at` column: when the lease ends or ended; none once settled.
    pub fn expires_at(&self) -> Option<Micros> {
        match *self {
            State::Pending(Lease::Held { expires_at, .. }) => expires_at,
            State::Pending(Lease::Released { at }) => at,
            _ => None,
        }
    }
}

/// What the claim of a key that has a record does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ClaimDecision {
    /// Answer from the record and write nothing.
    Answer(Answer),
    /// The lease is over (expired or released): take the key over with a new token.
    TakeOver,
    /// Its consumers died `max_attempts` times: mark it failed for good (a poison message).
    MarkPoison,
}

/// The answers a claim gives without writing.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Answer {
    /// Settled: replay the stored payload and token.
    Completed,
    /// Settled for good: replay the stored error.
    Failed,
    /// Another holder's lease is live, or another transaction holds the key right now.
    InProgress,
    /// The same key came with another fingerprint.
    Mismatch,
}

/// The claim of a key with a record, made at `now`. `locked` says whether the caller holds the
/// key's lock (it does not when `wait => false` found the key busy): without it nothing is taken.
/// `fingerprint` is the caller's, `stored` the record's.
pub fn claim(
    state: State,
    attempts: i32,
    stored: Option<&str>,
    fingerprint: Option<&str>,
    locked: bool,
    now: Micros,
    max_attempts: i32,
) -> ClaimDecision {
    if let (Some(stored), Some(given)) = (stored, fingerprint) {
        if stored != given {
            return ClaimDecision::Answer(Answer::Mismatch);
        }
    }
    let lease = match state {
        State::Completed { .. } => return ClaimDecision::Answer(Answer::Completed),
        State::Failed { .. } => return ClaimDecision::Answer(Answer::Failed),
        State::Pending(lease) => lease,
    };
    let live = matches!(lease, Lease::Held { expires_at: Some(end), .. } if end > now);
    if !locked || live {
        ClaimDecision::Answer(Answer::InProgress)
    } else if attempts >= max_attempts {
        ClaimDecision::MarkPoison
    } else {
        ClaimDecision::TakeOver
    }
}

/// Why a caller does not hold a key it wants to complete, fail or heartbeat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotHeld {
    /// The key has no record.
    Unknown,
    /// The key is completed or failed already.
    Settled(&'static str),
    /// Somebody else holds it, or nobody: the caller must abandon its attempt.
    LeaseLost(String),
}

/// The caller holds a key's lease when `token` is its current token, or when no token is given and
/// the caller's transaction made the claim (`claimed_here`). A token that is not the key's latest is
/// "lease lost" even when the key was settled since: that is what its stale holder needs to hear.
pub fn holds(state: Option<State>, token: Option<i64>, claimed_here: bool) -> Result<(), NotHeld> {
    let state = state.ok_or(NotHeld::Unknown)?;
    if let Some(given) = token {
        if state.token() != Some(given) {
            return Err(NotHeld::LeaseLost(format!("token {given} is not the current holder's")));
        }
    }
    match state {
        State::Completed { .. } | State::Failed { .. } => Err(NotHeld::Settled(state.status())),
        State::Pending(Lease::Released { .. }) => {
            Err(NotHeld::LeaseLost("the key was released after a retryable failure".into()))
        }
        State::Pending(Lease::Held { .. }) if token.is_none() && !claimed_here => {
            Err(NotHeld::LeaseLost("no token given and the claim was made by another transaction".into()))
        }
        State::Pending(Lease::Held { .. }) => Ok(()),
    }
}

/// What a failure reported by the holder does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FailDecision {
    /// Give the lease back: the next claim tries again.
    Release,
    /// Failed for good: not retryable, or the last attempt allowed.
    MarkFailed,
}

pub fn fail(retryable: bool, attempts: i32, max_attempts: i32) -> FailDecision {
    if retryable && attempts < max_attempts {
        FailDecision::Release
    } else {
        FailDecision::MarkFailed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Micros = 1_000_000;
    const HELD: State = State::Pending(Lease::Held { token: 7, expires_at: Some(NOW + 1) });
    const EXPIRED: State = State::Pending(Lease::Held { token: 7, expires_at: Some(NOW) });
    const RELEASED: State = State::Pending(Lease::Released { at: Some(NOW - 5) });

    fn decide(state: State, attempts: i32) -> ClaimDecision {
        claim(state, attempts, None, None, true, NOW, 5)
    }

    #[test]
    fn columns_round_trip_and_unknown_status_is_refused() {
        for s in [HELD, RELEASED, State::Completed { token: Some(3) }, State::Failed { token: None }] {
            assert_eq!(State::from_columns(s.status(), s.token(), s.expires_at()), Some(s));
        }
        assert_eq!(State::from_columns("archived", None, None), None);
        // A lease without an end is over.
        let endless = State::from_columns("pending", Some(1), None).unwrap();
        assert_eq!(claim(endless, 1, None, None, true, NOW, 5), ClaimDecision::TakeOver);
    }

    #[test]
    fn settled_keys_answer_without_writing() {
        assert_eq!(decide(State::Completed { token: Some(1) }, 1), ClaimDecision::Answer(Answer::Completed));
        assert_eq!(decide(State::Failed { token: None }, 9), ClaimDecision::Answer(Answer::Failed));
    }

    #[test]
    fn a_live_lease_is_in_progress_until_it_ends() {
        assert_eq!(decide(HELD, 1), ClaimDecision::Answer(Answer::InProgress));
        // The lease ends at expires_at itself.
        assert_eq!(decide(EXPIRED, 1), ClaimDecision::TakeOver);
        assert_eq!(decide(RELEASED, 1), ClaimDecision::TakeOver);
    }

    #[test]
    fn without_the_key_lock_nothing_is_taken() {
        assert_eq!(claim(EXPIRED, 1, None, None, false, NOW, 5), ClaimDecision::Answer(Answer::InProgress));
        assert_eq!(claim(RELEASED, 9, None, None, false, NOW, 5), ClaimDecision::Answer(Answer::InProgress));
        assert_eq!(
            claim(State::Completed { token: None }, 1, None, None, false, NOW, 5),
            ClaimDecision::Answer(Answer::Completed)
        );
    }

    #[test]
    fn the_last_allowed_attempt_makes_a_poison_message() {
        assert_eq!(decide(EXPIRED, 4), ClaimDecision::TakeOver);
        assert_eq!(decide(EXPIRED, 5), ClaimDecision::MarkPoison);
        assert_eq!(decide(RELEASED, 6), ClaimDecision::MarkPoison);
        // A live lease is never poisoned, whatever its attempts.
        assert_eq!(decide(HELD, 50), ClaimDecision::Answer(Answer::InProgress));
    }

    #[test]
    fn a_fingerprint_mismatch_wins_over_everything() {
        for state in
            [HELD, EXPIRED, RELEASED, State::Completed { token: None }, State::Failed { token: None }]
        {
            assert_eq!(
                claim(state, 1, Some("a"), Some("b"), true, NOW, 5),
                ClaimDecision::Answer(Answer::Mismatch)
            );
        }
        // Only two different fingerprints mismatch.
        assert_eq!(claim(EXPIRED, 1, Some("a"), Some("a"), true, NOW, 5), ClaimDecision::TakeOver);
        assert_eq!(claim(EXPIRED, 1, None, Some("b"), true, NOW, 5), ClaimDecision::TakeOver);
        assert_eq!(claim(EXPIRED, 1, Some("a"), None, true, NOW, 5), ClaimDecision::TakeOver);
    }

    #[test]
    fn the_holder_is_the_token_or_the_claiming_transaction() {
        assert_eq!(holds(Some(HELD), Some(7), false), Ok(()));
        assert_eq!(holds(Some(HELD), None, true), Ok(()));
        // An expired lease is still held until somebody takes it over.
        assert_eq!(holds(Some(EXPIRED), Some(7), false), Ok(()));
        assert!(matches!(holds(Some(HELD), None, false), Err(NotHeld::LeaseLost(_))));
        assert!(matches!(holds(Some(HELD), Some(8), true), Err(NotHeld::LeaseLost(_))));
        assert!(matches!(holds(Some(RELEASED), None, true), Err(NotHeld::LeaseLost(_))));
        assert_eq!(holds(None, Some(7), true), Err(NotHeld::Unknown));
    }

    #[test]
    fn a_stale_token_is_lease_lost_even_on_a_settled_key() {
        let done = State::Completed { token: Some(9) };
        assert!(matches!(holds(Some(done), Some(7), false), Err(NotHeld::LeaseLost(_))));
        assert_eq!(holds(Some(done), Some(9), false), Err(NotHeld::Settled("completed")));
        assert_eq!(holds(Some(State::Failed { token: None }), None, true), Err(NotHeld::Settled("failed")));
    }

    #[test]
    fn retryable_failures_release_until_the_last_attempt() {
        assert_eq!(fail(true, 1, 5), FailDecision::Release);
        assert_eq!(fail(true, 4, 5), FailDecision::Release);
        assert_eq!(fail(true, 5, 5), FailDecision::MarkFailed);
        assert_eq!(fail(false, 1, 5), FailDecision::MarkFailed);
    }
}
