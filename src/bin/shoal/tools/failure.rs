//! Why a command failed, said the way Kafka names it (`TopicAlreadyExists`), with a one-line hint.

use kafka_protocol::ResponseError;
use std::fmt;

/// A failed command: a name (the Kafka error's, or what went wrong on the way), what happened,
/// and what to try.
#[derive(Debug)]
pub struct Failure {
    pub name: String,
    pub message: String,
    pub hint: &'static str,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}\nhint: {}", self.name, self.message, self.hint)
    }
}

impl std::error::Error for Failure {}

impl Failure {
    /// A Kafka error code answered for `what` (`topic clicks`), with the broker's message if any.
    pub fn kafka(code: i16, what: &str, message: Option<&str>) -> Failure {
        let error =
            ResponseError::try_from_code(code).filter(|e| !matches!(e, ResponseError::Unknown(_)));
        let name = error.map_or_else(|| format!("KafkaError{code}"), |e| format!("{e:?}"));
        let detail = message
            .filter(|m| !m.is_empty())
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        Failure {
            name,
            message: format!("{what}{detail}"),
            hint: error.map_or("see the broker's log", hint),
        }
    }

    /// Checks a Kafka error code: `Ok` for 0.
    pub fn check(code: i16, what: &str, message: Option<&str>) -> Result<(), Failure> {
        match code {
            0 => Ok(()),
            _ => Err(Failure::kafka(code, what, message)),
        }
    }

    /// A failure that is not a Kafka error code.
    pub fn other(name: &str, message: impl Into<String>, hint: &'static str) -> Failure {
        Failure {
            name: name.to_string(),
            message: message.into(),
            hint,
        }
    }

    /// A command line the broker was never asked about.
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure::other("InvalidArguments", message, "see --help")
    }
}

/// An I/O error on the way to (or from) the broker: unreachable, timed out, refused by TLS or SASL.
impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        use std::io::ErrorKind::*;
        let mut text = e.to_string();
        if matches!(e.kind(), TimedOut | WouldBlock) {
            text += " (no answer within --timeout)";
        }
        let (name, hint) = if text.contains("SASL") {
            (
                "SaslAuthenticationFailed",
                "check --sasl-mechanism, --user and the password (--password-file or SHOAL_PASSWORD)",
            )
        } else if text.contains("TLS") || text.contains("certificate") {
            (
                "TlsFailed",
                "check --tls-ca (and --tls-cert/--tls-key), and that the listener speaks TLS",
            )
        } else {
            match e.kind() {
                TimedOut | WouldBlock => (
                    "TimedOut",
                    "is the broker reachable at --brokers? raise --timeout if it is slow",
                ),
                ConnectionRefused => (
                    "BrokerUnreachable",
                    "is the broker running, and listening at --brokers?",
                ),
                UnexpectedEof | ConnectionReset | ConnectionAborted => (
                    "ConnectionClosed",
                    "the broker closed the connection: does the listener want TLS or SASL?",
                ),
                _ => ("ClientError", "check --brokers and the broker's log"),
            }
        };
        Failure::other(name, text, hint)
    }
}

/// What to try next, for the errors an operator meets.
fn hint(e: ResponseError) -> &'static str {
    use ResponseError::*;
    match e {
        TopicAlreadyExists => "pick another name, or see it with `shoal topic describe NAME`",
        UnknownTopicOrPartition => "`shoal topic list` shows the topics there are",
        TopicAuthorizationFailed | ClusterAuthorizationFailed | GroupAuthorizationFailed => {
            "this user lacks an ACL for the operation: ask an administrator to grant it"
        }
        InvalidPartitions => "the partition count must be above zero and above the current count",
        InvalidReplicationFactor => "omit --replication-factor to take the broker's default",
        InvalidConfig | InvalidRequest => {
            "check the config names and values (`shoal topic describe NAME` lists them)"
        }
        InvalidTopicException => "topic names are letters, digits, '.', '_' and '-', at most 249",
        PolicyViolation => "the broker's policy refused it: see its log",
        NotController => "the controller moved: retry",
        NonEmptyGroup => {
            "stop the group's consumers first (`shoal group describe GROUP` lists its members)"
        }
        GroupIdNotFound => "`shoal group list` shows the groups there are",
        CoordinatorNotAvailable | NotCoordinator | CoordinatorLoadInProgress => {
            "the group's coordinator is moving or loading: retry in a moment"
        }
        SaslAuthenticationFailed | IllegalSaslState | UnsupportedSaslMechanism => {
            "check --sasl-mechanism, --user and the password"
        }
        UnsupportedVersion => "the broker does not serve this request's version",
        SecurityDisabled => {
            "the broker enforces no ACLs: start it with --authorizer acl (and --super-users) first"
        }
        _ => "see the broker's log",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_errors_are_named_with_a_hint() {
        let f = Failure::kafka(36, "topic t", Some("exists"));
        assert_eq!(f.name, "TopicAlreadyExists");
        assert_eq!(f.message, "topic t: exists");
        assert!(f.to_string().contains("hint: pick another name"));
        assert_eq!(Failure::kafka(-99, "x", None).name, "KafkaError-99");
        assert!(Failure::check(0, "x", None).is_ok());
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(Failure::from(refused).name, "BrokerUnreachable");
    }
}
