//! The price of a computed prompt token ([`PrefillFit`], [`price_of`]): a least-squares fit of
//! the engines' prefill times to the requests and the tokens they computed
//! (docs/shared-cache-hits.md), the prefill seconds the loaded tokens saved, and the
//! `PrefillPriced` condition.

use kvcache_api::condition::Cond;
use kvcache_api::model::conditions::PREFILL_PRICED;

use super::counters::Prefills;

/// The fewest prompt tokens the deployment's engines must have computed within
/// [`PRICE_HISTORY_MS`] before their prefills price a token (a prefill of 2,048 tokens on the
/// demo's CPU takes about 2 s, well above a step's fixed cost and its noise).
pub(crate) const MIN_PRICED_TOKENS: u64 = 2048;
/// The least spread (a standard deviation, in tokens) of the tokens computed per prefill across
/// the readings, below which a prefill's fixed cost cannot be told from a token's price: one
/// block of the demo's engines.
pub(crate) const MIN_SPREAD_TOKENS: f64 = 32.0;
/// The fewest readings of prefills beyond each engine's first a price is fitted to (an
/// engine's first reading fixes its own fixed cost): one fixes the price; its error is known
/// from a second on.
pub(crate) const MIN_PRICE_READINGS: u64 = 1;
/// The largest standard error of a price, as a share of it, that is shown: a fit that noisy
/// (an engine's first prefills, a node busy with other work) prices nothing yet.
pub(crate) const MAX_PRICE_ERROR: f64 = 0.5;

/// One engine's sums of a least-squares fit of prefill time to the requests and the tokens
/// computed: each reading of the engine (what it finished since it was last read: `n` requests
/// that computed `c` tokens in `t` µs) is taken as `t = a·n + b·c` plus noise that grows with
/// the requests (weighted by `1/n`), where `a` is the engine's fixed cost of a prefill and `b`
/// a computed token's price, the same for every engine of the deployment ([`price_of`]). Sums
/// add, so an engine's periods pool by adding them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct PrefillFit {
    /// Readings added (each with at least one request).
    readings: u64,
    /// Σ n.
    requests: f64,
    /// Σ c.
    tokens: f64,
    /// Σ c²/n.
    tokens_sq: f64,
    /// Σ t.
    micros: f64,
    /// Σ c·t/n.
    tokens_micros: f64,
    /// Σ t²/n.
    micros_sq: f64,
}

/// A computed token's price, from the engines' fits (`price_of`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefillPrice {
    /// One more computed prompt token, microseconds of prefill.
    pub per_token_micros: f64,
    /// A prefill's fixed cost, microseconds: what a step costs whatever its tokens, averaged
    /// over the engines by their prefills (none when the fit makes it negative).
    pub per_prefill_micros: f64,
    /// One standard error of `per_token_micros`; `None` until a second reading beyond each
    /// engine's first measures it.
    pub per_token_error_micros: Option<f64>,
    /// The prompt tokens the fit's prefills computed.
    pub computed_tokens: u64,
    /// The prefills (requests) fitted.
    pub prefills: u64,
    /// The readings of engines they came in.
    pub readings: u64,
}

/// Why the engines' prefills price no token yet.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unpriced {
    /// Fewer than `MIN_PRICED_TOKENS` computed.
    TooFewTokens {
        /// The tokens the prefills computed.
        computed: u64,
    },
    /// Fewer than `MIN_PRICE_READINGS` readings beyond each engine's first.
    TooFewReadings {
        /// The readings of engines' prefills.
        readings: u64,
        /// The engines they came from.
        engines: u64,
    },
    /// The prefills computed about as many tokens each (a spread under `MIN_SPREAD_TOKENS`).
    PrefillsAlike {
        /// The standard deviation of the tokens computed per prefill, tokens.
        spread: f64,
    },
    /// The prefills did not take longer for more tokens: something else (waiting for the CPU)
    /// set their time.
    NotGrowing,
    /// The fit's standard error is above `MAX_PRICE_ERROR` of the price.
    Unsettled {
        /// The price fitted, µs a token.
        per_token_micros: f64,
        /// Its standard error, µs.
        error_micros: f64,
    },
}

impl PrefillFit {
    /// Adds one reading of an engine's prefills (none: nothing is added).
    pub fn add(&mut self, p: &Prefills) {
        if p.requests == 0 {
            return;
        }
        let (n, c, t) = (p.requests as f64, p.computed_tokens as f64, p.micros as f64);
        self.readings += 1;
        self.requests += n;
        self.tokens += c;
        self.tokens_sq += c * c / n;
        self.micros += t;
        self.tokens_micros += c * t / n;
        self.micros_sq += t * t / n;
    }

    /// Adds every reading of `other`.
    pub fn merge(&mut self, other: &PrefillFit) {
        self.readings += other.readings;
        self.requests += other.requests;
        self.tokens += other.tokens;
        self.tokens_sq += other.tokens_sq;
        self.micros += other.micros;
        self.tokens_micros += other.tokens_micros;
        self.micros_sq += other.micros_sq;
    }

    /// This engine's fit alone: [`price_of`] one engine.
    #[cfg(test)]
    pub fn price(&self) -> Result<PrefillPrice, Unpriced> {
        price_of(std::slice::from_ref(self))
    }

    /// The residual sum of squares about the line of slope `b` through this engine's readings
    /// (its own fixed cost fitted), and that fixed cost.
    fn residuals(&self, b: f64) -> (f64, f64) {
        let (n, c, cc, t, ct, tt) = (
            self.requests,
            self.tokens,
            self.tokens_sq,
            self.micros,
            self.tokens_micros,
            self.micros_sq,
        );
        let a = (t - b * c) / n;
        let rss = tt - 2.0 * a * t - 2.0 * b * ct + a * a * n + 2.0 * a * b * c + b * b * cc;
        (rss, a)
    }
}

/// The price of a computed token from the engines' fits: the slope of the lines through each
/// engine's readings, one slope for all and a fixed cost for each (engines differ in what a
/// step costs them: a node busier than another, a reader whose steps follow its loads), so that
/// only an engine's prefills of different sizes say what a token costs. Known once at least
/// [`MIN_PRICED_TOKENS`] were computed, in [`MIN_PRICE_READINGS`] readings or more beyond each
/// engine's first, of prefills whose sizes spread within the engines by at least
/// [`MIN_SPREAD_TOKENS`], and the price's standard error is at most [`MAX_PRICE_ERROR`] of it.
pub(crate) fn price_of(engines: &[PrefillFit]) -> Result<PrefillPrice, Unpriced> {
    let engines: Vec<&PrefillFit> = engines.iter().filter(|f| f.readings > 0).collect();
    let tokens: f64 = engines.iter().map(|f| f.tokens).sum();
    let computed = tokens.round() as u64;
    if computed < MIN_PRICED_TOKENS {
        return Err(Unpriced::TooFewTokens { computed });
    }
    let readings: u64 = engines.iter().map(|f| f.readings).sum();
    let count = engines.len() as u64;
    if readings < count + MIN_PRICE_READINGS {
        return Err(Unpriced::TooFewReadings {
            readings,
            engines: count,
        });
    }
    let requests: f64 = engines.iter().map(|f| f.requests).sum();
    // Within each engine: the spread of its tokens a prefill, and how its time follows them.
    let spread_sq: f64 = engines
        .iter()
        .map(|f| f.tokens_sq - f.tokens * f.tokens / f.requests)
        .sum();
    let together: f64 = engines
        .iter()
        .map(|f| f.tokens_micros - f.tokens * f.micros / f.requests)
        .sum();
    let spread = (spread_sq.max(0.0) / requests).sqrt();
    if spread < MIN_SPREAD_TOKENS {
        return Err(Unpriced::PrefillsAlike { spread });
    }
    let b = together / spread_sq;
    if !(b > 0.0 && b.is_finite()) {
        return Err(Unpriced::NotGrowing);
    }
    let (mut rss, mut fixed) = (0.0, 0.0);
    for f in &engines {
        let (r, a) = f.residuals(b);
        rss += r;
        fixed += a * f.requests;
    }
    let spare = readings - count - MIN_PRICE_READINGS;
    let error = (spare > 0).then(|| (rss.max(0.0) / spare as f64 / spread_sq).sqrt());
    if let Some(error) = error
        && error > MAX_PRICE_ERROR * b
    {
        return Err(Unpriced::Unsettled {
            per_token_micros: b,
            error_micros: error,
        });
    }
    Ok(PrefillPrice {
        per_token_micros: b,
        per_prefill_micros: (fixed / requests).max(0.0),
        per_token_error_micros: error,
        computed_tokens: computed,
        prefills: requests.round() as u64,
        readings,
    })
}

/// The prefill `loaded` tokens spared at `price`, less the `load_micros` their loads took, with
/// its standard error (µs): with nothing loaded, the loads' time alone (exact), with tokens
/// loaded and no price, none.
pub(super) fn saved(
    loaded: u64,
    load_micros: u64,
    price: Option<&PrefillPrice>,
) -> Option<(f64, Option<f64>)> {
    let spent = load_micros as f64;
    if loaded == 0 {
        return Some((-spent, Some(0.0)));
    }
    let p = price?;
    let tokens = loaded as f64;
    Some((
        tokens * p.per_token_micros - spent,
        p.per_token_error_micros.map(|e| tokens * e),
    ))
}

/// `PrefillPriced`: the price of a computed token and what it was fitted to, or why there is
/// none yet (`prefillSecondsSaved` is then absent while tokens were loaded).
pub fn price_condition(price: &Result<PrefillPrice, Unpriced>) -> Cond {
    match price {
        Ok(p) => Cond::yes(
            PREFILL_PRICED,
            "Priced",
            format!(
                "a computed prompt token costs {:.4} ms ({}) of prefill and a prefill {:.0} ms besides, fitted to {} tokens computed in {} prefills ({} readings of the engines) within the last hour",
                p.per_token_micros / 1e3,
                p.per_token_error_micros.map_or_else(
                    || "no error bar until a second reading beyond each engine's first".to_owned(),
                    |e| format!("± {:.4} ms", e / 1e3)
                ),
                p.per_prefill_micros / 1e3,
                p.computed_tokens,
                p.prefills,
                p.readings
            ),
        ),
        Err(Unpriced::TooFewTokens { computed }) => Cond::unknown(
            PREFILL_PRICED,
            "TooFewTokensComputed",
            format!(
                "the engines computed {computed} prompt tokens within the last hour and a price needs {MIN_PRICED_TOKENS}: status.sharedCache.prefillSecondsSaved stays absent while tokens are loaded from the store"
            ),
        ),
        Err(Unpriced::TooFewReadings { readings, engines }) => Cond::unknown(
            PREFILL_PRICED,
            "TooFewReadings",
            format!(
                "the prefills of {engines} engine(s) were read {readings} time(s) within the last hour and a price needs {MIN_PRICE_READINGS} reading(s) beyond each engine's first (an engine is read every --engine-metrics-interval): status.sharedCache.prefillSecondsSaved stays absent while tokens are loaded"
            ),
        ),
        Err(Unpriced::Unsettled {
            per_token_micros,
            error_micros,
        }) => Cond::unknown(
            PREFILL_PRICED,
            "PriceUnsettled",
            format!(
                "the engines' prefills put a computed token at {:.4} ms ± {:.4} ms, more than {:.0} % uncertain (a busy node, an engine's first prefills): status.sharedCache.prefillSecondsSaved stays absent while tokens are loaded, until more prefills settle it",
                per_token_micros / 1e3,
                error_micros / 1e3,
                MAX_PRICE_ERROR * 100.0
            ),
        ),
        Err(Unpriced::PrefillsAlike { spread }) => Cond::unknown(
            PREFILL_PRICED,
            "PrefillsAlike",
            format!(
                "the engines' prefills computed about as many tokens each (they spread by {spread:.0} tokens, under {MIN_SPREAD_TOKENS:.0}): a prefill's fixed cost cannot be told from a token's price until prefills of other sizes are read; status.sharedCache.prefillSecondsSaved stays absent while tokens are loaded"
            ),
        ),
        Err(Unpriced::NotGrowing) => Cond::unknown(
            PREFILL_PRICED,
            "PrefillsNotGrowing",
            "the engines' prefills did not take longer for more tokens computed: their time is set by something else (waiting for the CPU or GPU); status.sharedCache.prefillSecondsSaved stays absent while tokens are loaded",
        ),
    }
}
