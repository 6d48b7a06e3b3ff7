//! The caller's W3C `traceparent` as the OpenTelemetry parent of the call's span (feature
//! `opentelemetry`).
//!
//! The header is read as W3C Trace Context says: `{version}-{trace-id}-{parent-id}-{flags}`,
//! all lowercase hex, ids not all zero. Version `00` has exactly these four fields; a later
//! version may append more after a `-`, and only the first four are read. Version `ff` is
//! invalid. Only the `sampled` bit of the flags is kept.

use std::fmt;

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::envelope::ToolCall;

/// The length of a version `00` header, and the least length of any version.
const FOUR_FIELDS_LEN: usize = 55;

/// The fields of a well-formed `traceparent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TraceParent {
    pub(super) trace_id: u128,
    pub(super) parent_id: u64,
    pub(super) sampled: bool,
}

/// Why a `traceparent` was not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Malformed {
    TooShort,
    Version,
    Separator,
    TraceId,
    ParentId,
    Flags,
    TrailingData,
    ZeroTraceId,
    ZeroParentId,
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Malformed::TooShort => "is shorter than the 55 characters of its four fields",
            Malformed::Version => "has a version that is not two lowercase hex digits or is ff",
            Malformed::Separator => "does not separate its fields with `-`",
            Malformed::TraceId => "has a trace id that is not 32 lowercase hex digits",
            Malformed::ParentId => "has a parent id that is not 16 lowercase hex digits",
            Malformed::Flags => "has flags that are not two lowercase hex digits",
            Malformed::TrailingData => "has version 00 but is longer than its 55 characters",
            Malformed::ZeroTraceId => "has an all-zero trace id",
            Malformed::ZeroParentId => "has an all-zero parent id",
        })
    }
}

impl TraceParent {
    /// Reads `header`; never panics, whatever the input.
    pub(super) fn parse(header: &str) -> Result<TraceParent, Malformed> {
        let bytes = header.as_bytes();
        if bytes.len() < FOUR_FIELDS_LEN {
            return Err(Malformed::TooShort);
        }
        let version = lower_hex(&bytes[0..2]).ok_or(Malformed::Version)?;
        if version == 0xff {
            return Err(Malformed::Version);
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return Err(Malformed::Separator);
        }
        let trace_id = lower_hex(&bytes[3..19])
            .zip(lower_hex(&bytes[19..35]))
            .map(|(high, low)| u128::from(high) << 64 | u128::from(low))
            .ok_or(Malformed::TraceId)?;
        let parent_id = lower_hex(&bytes[36..52]).ok_or(Malformed::ParentId)?;
        let flags = lower_hex(&bytes[53..55]).ok_or(Malformed::Flags)?;
        match bytes.get(FOUR_FIELDS_LEN) {
            None => {}
            Some(_) if version == 0 => return Err(Malformed::TrailingData),
            Some(b'-') => {}
            Some(_) => return Err(Malformed::Separator),
        }
        if trace_id == 0 {
            return Err(Malformed::ZeroTraceId);
        }
        if parent_id == 0 {
            return Err(Malformed::ZeroParentId);
        }
        Ok(TraceParent {
            trace_id,
            parent_id,
            sampled: flags & 0x01 == 1,
        })
    }

    /// The remote span context the header names.
    fn span_context(self) -> SpanContext {
        let flags = if self.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::NOT_SAMPLED
        };
        SpanContext::new(
            TraceId::from(self.trace_id),
            SpanId::from(self.parent_id),
            flags,
            true,
            TraceState::NONE,
        )
    }
}

/// `digits` (at most 16) as a number, if they are all lowercase hex.
fn lower_hex(digits: &[u8]) -> Option<u64> {
    let mut value = 0u64;
    let mut valid = true;
    for &digit in digits {
        let nibble = match digit {
            b'0'..=b'9' => digit - b'0',
            b'a'..=b'f' => digit - b'a' + 10,
            _ => {
                valid = false;
                0
            }
        };
        value = value << 4 | u64::from(nibble);
    }
    valid.then_some(value)
}

/// Makes the call's `traceparent`, if well-formed, the OpenTelemetry parent of `span`, which
/// must not have been entered yet. A malformed one is logged at DEBUG and ignored, and so is
/// a well-formed one when no OpenTelemetry layer listens.
pub(super) fn adopt_remote_parent(span: &Span, call: &ToolCall) {
    let Some(header) = call.trace().traceparent.as_deref() else {
        return;
    };
    match TraceParent::parse(header) {
        Ok(parent) => {
            let context =
                opentelemetry::Context::new().with_remote_span_context(parent.span_context());
            // The only errors: no OpenTelemetry layer, or a span already started; either way
            // the span keeps its local parent.
            let _ = span.set_parent(context);
        }
        Err(why) => span.in_scope(|| {
            tracing::debug!(
                requestId = &*crate::redact::identifier(call.request_id()),
                "trace.traceparent ignored: it {why}; the span keeps its local parent"
            );
        }),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{Malformed, TraceParent};

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_version_00_header_gives_its_ids_and_sampled_flag() {
        assert_eq!(
            TraceParent::parse(VALID),
            Ok(TraceParent {
                trace_id: 0x4bf92f3577b34da6a3ce929d0e0e4736,
                parent_id: 0x00f067aa0ba902b7,
                sampled: true,
            })
        );
        let unsampled = TraceParent::parse(&VALID.replace("-01", "-00")).unwrap();
        assert!(!unsampled.sampled);
        // Flags other than `sampled` are ignored.
        let other_flags = TraceParent::parse(&VALID.replace("-01", "-fe")).unwrap();
        assert!(!other_flags.sampled);
    }

    #[test]
    fn a_later_version_is_read_by_its_first_four_fields() {
        let later = VALID.replacen("00", "cc", 1);
        let expected = TraceParent::parse(VALID).unwrap();
        assert_eq!(TraceParent::parse(&later), Ok(expected));
        assert_eq!(
            TraceParent::parse(&format!("{later}-what-the-future-holds")),
            Ok(expected)
        );
        assert_eq!(
            TraceParent::parse(&format!("{later}x")),
            Err(Malformed::Separator)
        );
    }

    #[test]
    fn malformed_headers_say_what_is_wrong() {
        let cases = [
            ("", Malformed::TooShort),
            (&VALID[..54], Malformed::TooShort),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Malformed::Version,
            ),
            (
                "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Malformed::Version,
            ),
            (
                "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Malformed::Separator,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
                Malformed::Separator,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01",
                Malformed::Separator,
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                Malformed::TraceId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01",
                Malformed::TraceId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
                Malformed::ParentId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
                Malformed::Flags,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
                Malformed::TrailingData,
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                Malformed::ZeroTraceId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                Malformed::ZeroParentId,
            ),
            // Multi-byte characters where the separators should be.
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473é00f067aa0ba902b7-01",
                Malformed::Separator,
            ),
        ];
        for (header, expected) in cases {
            assert_eq!(TraceParent::parse(header), Err(expected), "{header:?}");
        }
    }

    proptest! {
        #[test]
        fn any_string_is_parsed_or_refused_without_panicking(header in any::<String>()) {
            let _ = TraceParent::parse(&header);
        }

        #[test]
        fn near_misses_are_parsed_or_refused_without_panicking(
            header in "[0-9a-fA-F-]{50,60}[\\PC]{0,4}"
        ) {
            let _ = TraceParent::parse(&header);
        }

        #[test]
        fn every_well_formed_header_gives_back_its_fields(
            trace_id in 1u128..,
            parent_id in 1u64..,
            flags in any::<u8>(),
        ) {
            let header = format!("00-{trace_id:032x}-{parent_id:016x}-{flags:02x}");
            prop_assert_eq!(
                TraceParent::parse(&header),
                Ok(TraceParent { trace_id, parent_id, sampled: flags & 1 == 1 })
            );
        }
    }
}
