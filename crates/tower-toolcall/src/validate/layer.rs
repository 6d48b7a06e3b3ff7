use std::sync::Arc;

use tower_layer::Layer;

use super::service::{EnvelopeValidate, Validator};
use crate::canonical::CanonicalOptions;
use crate::error::ConfigError;
use crate::registry::ToolRegistry;

/// The default size limit of params: 1 MiB of canonical JSON.
pub const DEFAULT_MAX_PARAMS_BYTES: usize = 1 << 20;

/// Applies [`EnvelopeValidate`] to a service. See the [module docs](crate::validate).
///
/// Clones share one validator (registry, limits and options) behind an [`Arc`].
#[derive(Clone, Debug)]
pub struct EnvelopeValidateLayer {
    validator: Arc<Validator>,
}

impl EnvelopeValidateLayer {
    /// A layer with the default limits, checking calls against `registry`.
    pub fn new(registry: ToolRegistry) -> Self {
        EnvelopeValidateLayer::builder(registry)
            .build()
            .expect("the default configuration is valid")
    }

    /// A builder for a layer with other limits.
    pub fn builder(registry: ToolRegistry) -> EnvelopeValidateLayerBuilder {
        EnvelopeValidateLayerBuilder {
            registry,
            canonical: CanonicalOptions::default(),
            max_params_bytes: DEFAULT_MAX_PARAMS_BYTES,
            check_output: true,
        }
    }
}

impl<S> Layer<S> for EnvelopeValidateLayer {
    type Service = EnvelopeValidate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        EnvelopeValidate::new(inner, self.validator.clone())
    }
}

/// Builds an [`EnvelopeValidateLayer`].
///
/// ```
/// use tower_toolcall::registry::ToolRegistry;
/// use tower_toolcall::EnvelopeValidateLayer;
///
/// let layer = EnvelopeValidateLayer::builder(ToolRegistry::open())
///     .max_params_bytes(64 * 1024)
///     .check_output(false)
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Debug)]
#[must_use]
pub struct EnvelopeValidateLayerBuilder {
    registry: ToolRegistry,
    canonical: CanonicalOptions,
    max_params_bytes: usize,
    check_output: bool,
}

impl EnvelopeValidateLayerBuilder {
    /// The largest params accepted, in bytes of canonical JSON (default 1 MiB); a tool's
    /// `policy.validate.max_params_bytes` overrides it.
    pub fn max_params_bytes(mut self, bytes: usize) -> Self {
        self.max_params_bytes = bytes;
        self
    }

    /// The canonical options whose depth limit and normalizations the size check uses.
    pub fn canonical_options(mut self, options: CanonicalOptions) -> Self {
        self.canonical = options;
        self
    }

    /// Whether outputs are checked against output schemas (default `true`); a tool's
    /// `policy.validate.check_output` overrides it.
    pub fn check_output(mut self, check: bool) -> Self {
        self.check_output = check;
        self
    }

    /// Checks the configuration and builds the layer.
    pub fn build(self) -> Result<EnvelopeValidateLayer, ConfigError> {
        if self.max_params_bytes < 2 {
            return Err(ConfigError::new(
                "validate.max_params_bytes",
                format!(
                    "must be at least 2 (the size of `{{}}`), got {}",
                    self.max_params_bytes
                ),
            ));
        }
        Ok(EnvelopeValidateLayer {
            validator: Arc::new(Validator {
                registry: self.registry,
                canonical: self.canonical,
                max_params_bytes: self.max_params_bytes,
                check_output: self.check_output,
            }),
        })
    }
}
