use std::sync::Arc;

use tower_layer::Layer;

use super::service::{EnvelopeValidate, Validator};
use crate::canonical::CanonicalOptions;
use crate::error::ConfigError;
use crate::registry::{ToolRegistry, ValidateSettings};
use crate::stack_part::{StackPart, StackShared};

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
            settings: ValidateSettings::default(),
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
/// use tower_toolcall::registry::{ToolRegistry, ValidateSettings};
/// use tower_toolcall::EnvelopeValidateLayer;
///
/// let settings = ValidateSettings::default()
///     .with_max_params_bytes(64 * 1024)
///     .with_check_output(false);
/// let layer = EnvelopeValidateLayer::builder(ToolRegistry::open())
///     .settings(settings)
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), tower_toolcall::ConfigError>(())
/// ```
#[derive(Debug)]
#[must_use]
pub struct EnvelopeValidateLayerBuilder {
    registry: ToolRegistry,
    canonical: CanonicalOptions,
    settings: ValidateSettings,
}

impl EnvelopeValidateLayerBuilder {
    /// The layer's settings: the largest params accepted, in bytes of canonical JSON
    /// (default 1 MiB), and whether outputs are checked against output schemas (default
    /// `true`). A tool's `policy.validate` overrides them.
    pub fn settings(mut self, settings: ValidateSettings) -> Self {
        self.settings = settings;
        self
    }

    /// The canonical options whose depth limit and normalizations the size check uses.
    pub fn canonical_options(mut self, options: CanonicalOptions) -> Self {
        self.canonical = options;
        self
    }

    /// Checks the configuration and builds the layer.
    pub fn build(self) -> Result<EnvelopeValidateLayer, ConfigError> {
        self.settings.check().map_err(|e| e.within("validate"))?;
        Ok(EnvelopeValidateLayer {
            validator: Arc::new(Validator {
                registry: self.registry,
                canonical: self.canonical,
                max_params_bytes: self
                    .settings
                    .max_params_bytes
                    .unwrap_or(DEFAULT_MAX_PARAMS_BYTES),
                check_output: self.settings.check_output.unwrap_or(true),
            }),
        })
    }
}

impl StackPart for EnvelopeValidateLayerBuilder {
    type Layer = EnvelopeValidateLayer;

    fn part(registry: &ToolRegistry) -> Self {
        EnvelopeValidateLayer::builder(registry.clone())
    }

    fn build_part(self, shared: &mut StackShared) -> Result<Self::Layer, ConfigError> {
        match &shared.canonical {
            Some(options) => self.canonical_options(options.clone()),
            None => self,
        }
        .build()
    }
}
