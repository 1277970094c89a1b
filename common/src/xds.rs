//! The xDS protocol's rules for a request that answers a response, written once for every
//! server that speaks it (istiod-core's ADS, the agent's SDS): a request names the nonce of the
//! response it answers; with an error detail it rejects it (NACK), without one it accepts it
//! (ACK); a nonce other than the last one sent answers a response since superseded, and an
//! empty nonce is a fresh request (a stream's first for the type). In state of the world, an
//! ACK that names the resources already served asks for nothing new.

/// The type of the health reports an agent sends upstream on its xDS stream (Istio's
/// `model.HealthInfoType`): a bare request, healthy without `error_detail`, unhealthy with it;
/// the control plane answers nothing.
pub const HEALTH_INFO_TYPE: &str = "type.googleapis.com/istio.v1.HealthInformation";

/// How a request relates to the last response sent for its type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// No response nonce: a fresh request.
    Fresh,
    /// Accepts the last response.
    Ack,
    /// Rejects the last response, with the client's error detail.
    Nack(String),
    /// Answers a response since superseded; it says nothing about the current one.
    Stale,
}

/// Classifies a request by its response nonce and error detail against `nonce_sent`.
pub fn answer(nonce: &str, nonce_sent: &str, error: Option<&str>) -> Answer {
    if nonce.is_empty() {
        Answer::Fresh
    } else if nonce != nonce_sent {
        Answer::Stale
    } else if let Some(why) = error {
        Answer::Nack(why.to_string())
    } else {
        Answer::Ack
    }
}

/// One type's state-of-the-world subscription on one stream: the names last asked for and the
/// nonce of the last response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription<N> {
    pub names: Vec<N>,
    pub nonce_sent: String,
}

impl<N> Default for Subscription<N> {
    fn default() -> Self {
        Subscription {
            names: Vec::new(),
            nonce_sent: String::new(),
        }
    }
}

/// What a state-of-the-world request calls for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing is sent: a stale answer, a NACK (the same config again would be rejected
    /// again), or an ACK naming what was already served.
    Ignore(Answer),
    /// The names are new (or the request is fresh): a response is owed.
    Respond(Answer),
}

impl<N: PartialEq> Subscription<N> {
    /// Applies a request: its answer to our last response, and the names it asks for. The
    /// names are taken only when a response is owed for them.
    pub fn on_request(&mut self, nonce: &str, error: Option<&str>, names: Vec<N>) -> Step {
        let answer = answer(nonce, &self.nonce_sent, error);
        match answer {
            Answer::Stale | Answer::Nack(_) => Step::Ignore(answer),
            Answer::Ack if names == self.names => Step::Ignore(answer),
            Answer::Fresh | Answer::Ack => {
                self.names = names;
                Step::Respond(answer)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_follow_the_nonce_and_the_error_detail() {
        assert_eq!(answer("", "3", None), Answer::Fresh);
        assert_eq!(answer("2", "3", Some("bad")), Answer::Stale);
        assert_eq!(answer("3", "3", Some("bad")), Answer::Nack("bad".into()));
        assert_eq!(answer("3", "3", None), Answer::Ack);
    }

    #[test]
    fn a_subscription_responds_to_fresh_requests_and_new_names_only() {
        let mut sub = Subscription::<&str>::default();
        assert_eq!(
            sub.on_request("", None, vec!["a"]),
            Step::Respond(Answer::Fresh)
        );
        sub.nonce_sent = "1".into();
        // ACK of what was served: nothing owed.
        assert_eq!(
            sub.on_request("1", None, vec!["a"]),
            Step::Ignore(Answer::Ack)
        );
        // A NACK that also asks for other names is not answered, and the names stay.
        assert_eq!(
            sub.on_request("1", Some("bad"), vec!["b"]),
            Step::Ignore(Answer::Nack("bad".into()))
        );
        assert_eq!(sub.names, vec!["a"]);
        // A stale answer is ignored whatever it names.
        assert_eq!(
            sub.on_request("0", None, vec!["c"]),
            Step::Ignore(Answer::Stale)
        );
        // An ACK naming more: a response is owed, for the new names.
        assert_eq!(
            sub.on_request("1", None, vec!["a", "b"]),
            Step::Respond(Answer::Ack)
        );
        assert_eq!(sub.names, vec!["a", "b"]);
    }
}
