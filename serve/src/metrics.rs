//! What `/metrics` reports, in Prometheus' text format.

use prometheus::{Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

pub struct Metrics {
    registry: Registry,
    /// Requests answered, by endpoint and HTTP status.
    pub requests: IntCounterVec,
    pub prompt_tokens: IntCounter,
    /// Prompt tokens found in a row's caches and not prefilled again.
    pub cached_prompt_tokens: IntCounter,
    pub generated_tokens: IntCounter,
    /// Sequences (a request's choices, for each of its prompts) waiting for a row.
    pub queue_depth: IntGauge,
    /// Rows holding a sequence, of `batch_rows`.
    pub rows_occupied: IntGauge,
    pub batch_rows: IntGauge,
    /// Engine calls, by kind (`prefill`, `decode`).
    pub engine_calls: IntCounterVec,
    pub time_to_first_token: Histogram,
    pub time_per_output_token: Histogram,
    pub request_duration: Histogram,
}

impl Metrics {
    pub fn new(batch: usize) -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            registry.register(Box::new(c.clone())).expect("registered once");
            c
        };
        let counters = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry.register(Box::new(c.clone())).expect("registered once");
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid metric");
            registry.register(Box::new(g.clone())).expect("registered once");
            g
        };
        let seconds = |name: &str, help: &str, buckets: Vec<f64>| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid metric");
            registry.register(Box::new(h.clone())).expect("registered once");
            h
        };
        let latency = vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
        let metrics = Metrics {
            requests: counters(
                "g4c_requests_total",
                "Requests answered, by endpoint and HTTP status",
                &["endpoint", "status"],
            ),
            prompt_tokens: counter(
                "g4c_prompt_tokens_total",
                "Prompt tokens of admitted sequences (each of a request's choices)",
            ),
            cached_prompt_tokens: counter(
                "g4c_cached_prompt_tokens_total",
                "Prompt tokens found in a row's caches and not prefilled again",
            ),
            generated_tokens: counter("g4c_generated_tokens_total", "Tokens generated"),
            queue_depth: gauge("g4c_queue_depth", "Sequences waiting for a row"),
            rows_occupied: gauge("g4c_batch_rows_occupied", "Rows of the batch holding a sequence"),
            batch_rows: gauge("g4c_batch_rows", "Rows of the batch (sequences decoded together)"),
            engine_calls: counters("g4c_engine_calls_total", "Calls of the model, by kind", &["kind"]),
            time_to_first_token: seconds(
                "g4c_time_to_first_token_seconds",
                "From a request's arrival to its first generated token",
                latency.clone(),
            ),
            time_per_output_token: seconds(
                "g4c_time_per_output_token_seconds",
                "Mean time between a request's generated tokens after the first",
                vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5],
            ),
            request_duration: seconds("g4c_request_duration_seconds", "From a request's arrival to its end", latency),
            registry,
        };
        metrics.batch_rows.set(batch as i64);
        metrics
    }

    pub fn render(&self) -> String {
        let mut out = vec![];
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("text encoding of gathered metrics");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}
