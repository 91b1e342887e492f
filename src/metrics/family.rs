//! Building Prometheus metric families: a gauge, counter or histogram family, and its
//! samples with their labels.

use crate::shard::{LATENCY_BOUNDS_US, LatencySnapshot};
use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};

/// A metric family under construction.
pub(super) struct Family(pub(super) MetricFamily);

impl Family {
    fn new(name: &str, help: &str, kind: MetricType) -> Family {
        let mut f = MetricFamily::default();
        f.set_name(name.to_string());
        f.set_help(help.to_string());
        f.set_field_type(kind);
        Family(f)
    }

    fn metric(&mut self, labels: &[(&str, &str)], set: impl FnOnce(&mut Metric)) -> &mut Self {
        let mut m = Metric::default();
        m.set_label(
            labels
                .iter()
                .map(|(k, v)| {
                    let mut l = LabelPair::default();
                    l.set_name(k.to_string());
                    l.set_value(v.to_string());
                    l
                })
                .collect(),
        );
        set(&mut m);
        self.0.mut_metric().push(m);
        self
    }

    pub(super) fn gauge(&mut self, labels: &[(&str, &str)], v: f64) -> &mut Self {
        self.metric(labels, |m| {
            let mut g = Gauge::default();
            g.set_value(v);
            m.set_gauge(g);
        })
    }

    pub(super) fn counter(&mut self, labels: &[(&str, &str)], v: f64) -> &mut Self {
        self.metric(labels, |m| {
            let mut c = Counter::default();
            c.set_value(v);
            m.set_counter(c);
        })
    }
}

pub(super) fn gauge(name: &str, help: &str) -> Family {
    Family::new(name, help, MetricType::GAUGE)
}

pub(super) fn counter(name: &str, help: &str) -> Family {
    Family::new(name, help, MetricType::COUNTER)
}

/// A gauge family with one unlabelled sample.
pub(super) fn one_gauge(name: &str, help: &str, v: f64) -> Family {
    let mut f = gauge(name, help);
    f.gauge(&[], v);
    f
}

/// A counter family with one unlabelled sample.
pub(super) fn one_counter(name: &str, help: &str, v: f64) -> Family {
    let mut f = counter(name, help);
    f.counter(&[], v);
    f
}

pub(super) fn histogram(name: &str, help: &str, h: &LatencySnapshot) -> Family {
    let mut f = Family::new(name, help, MetricType::HISTOGRAM);
    f.metric(&[], |m| {
        let mut hist = Histogram::default();
        hist.set_sample_count(h.count);
        hist.set_sample_sum(h.sum_ns as f64 / 1e9);
        let mut cumulative = 0;
        let buckets = LATENCY_BOUNDS_US
            .iter()
            .zip(&h.buckets)
            .map(|(&le_us, &n)| {
                cumulative += n;
                let mut b = Bucket::default();
                b.set_upper_bound(le_us as f64 / 1e6);
                b.set_cumulative_count(cumulative);
                b
            })
            .collect();
        hist.set_bucket(buckets);
        m.set_histogram(hist);
    });
    f
}
