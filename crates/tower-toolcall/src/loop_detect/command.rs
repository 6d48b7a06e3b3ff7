//! The in-chat commands that set and unset a session's loop detection settings.
//!
//! ```text
//! !/set(tool-loop-detection=true|false)
//! !/set(tool-loop-max-repeats=4)
//! !/set(tool-loop-ttl=120)
//! !/set(tool-loop-mode=break|chance|chance_then_break)
//! !/set(tool-loop-max-failures=3)
//! !/set(tool-loop-poll-budget-seconds=300)
//! !/set(tool-loop-max-repeats=6, tool-loop-mode=chance)
//! !/unset(tool-loop-detection, tool-loop-max-repeats, tool-loop-ttl, tool-loop-mode)
//! !/unset(tool-loop-max-failures, tool-loop-poll-budget-seconds)
//! ```
//!
//! Command words and setting names are matched without regard to case; spaces around names,
//! values and commas are ignored.

use std::fmt;
use std::str::FromStr;

use super::config::LoopSettingKey;
use super::config::{
    parse_bool, parse_max_repeats, parse_mode, parse_poll_budget_secs, parse_ttl_secs,
};
use crate::registry::LoopDetectSettings;

/// A parsed `!/set(…)` or `!/unset(…)` command.
///
/// ```
/// use tower_toolcall::loop_detect::{
///     CommandErrorKind, LoopCommand, LoopDetectSettings, LoopSettingKey,
/// };
///
/// let set: LoopCommand = "!/set(tool-loop-max-repeats=6)".parse()?;
/// let mut six = LoopDetectSettings::default();
/// six.max_repeats = Some(6);
/// assert_eq!(set, LoopCommand::Set(six));
///
/// let unset = LoopCommand::parse("!/unset(tool-loop-mode, tool-loop-ttl)")?;
/// assert_eq!(unset, LoopCommand::Unset(vec![LoopSettingKey::Mode, LoopSettingKey::Ttl]));
///
/// let err = LoopCommand::parse("!/set(tool-loop-max-repeats=many)").unwrap_err();
/// assert_eq!(err.kind(), CommandErrorKind::BadNumber);
/// assert_eq!(err.key(), Some("tool-loop-max-repeats"));
/// # Ok::<(), tower_toolcall::loop_detect::CommandError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoopCommand {
    /// Sets the given settings; the others keep their value.
    Set(LoopDetectSettings),
    /// Removes these settings, so that the next tier decides.
    Unset(Vec<LoopSettingKey>),
}

impl LoopCommand {
    /// Parses one command; the error says what is wrong and names the setting involved.
    pub fn parse(input: &str) -> Result<LoopCommand, CommandError> {
        let text = input.trim();
        let (verb, rest) = if let Some(rest) = strip_prefix_ignore_case(text, "!/unset") {
            (Verb::Unset, rest)
        } else if let Some(rest) = strip_prefix_ignore_case(text, "!/set") {
            (Verb::Set, rest)
        } else {
            return Err(CommandError::not_a_command(text));
        };
        if rest.starts_with(|c: char| c.is_alphanumeric() || c == '-' || c == '_') {
            // `!/settings(…)` is another command.
            return Err(CommandError::not_a_command(text));
        }
        let Some(open) = rest.trim_start().strip_prefix('(') else {
            return Err(CommandError::new(
                CommandErrorKind::MissingParenthesis,
                None,
                format!(
                    "`{verb}` must be followed by `(`, as in `{}`",
                    verb.example()
                ),
            ));
        };
        let Some((inside, after)) = open.split_once(')') else {
            return Err(CommandError::new(
                CommandErrorKind::MissingParenthesis,
                None,
                format!("`{verb}(` is missing its closing parenthesis `)`"),
            ));
        };
        if !after.trim().is_empty() {
            return Err(CommandError::new(
                CommandErrorKind::TrailingText,
                None,
                format!(
                    "unexpected text after `{verb}(…)`: {:?}",
                    shorten(after.trim())
                ),
            ));
        }
        if inside.trim().is_empty() {
            return Err(CommandError::new(
                CommandErrorKind::Empty,
                None,
                format!("`{verb}()` names no setting; name one of {}", key_list()),
            ));
        }
        match verb {
            Verb::Set => parse_set(inside).map(LoopCommand::Set),
            Verb::Unset => parse_unset(inside).map(LoopCommand::Unset),
        }
    }

    /// `settings` after this command.
    pub fn apply_to(&self, settings: LoopDetectSettings) -> LoopDetectSettings {
        match self {
            LoopCommand::Set(set) => set.clone().over(&settings),
            LoopCommand::Unset(keys) => keys.iter().fold(settings, |s, key| s.without(*key)),
        }
    }
}

impl FromStr for LoopCommand {
    type Err = CommandError;

    fn from_str(s: &str) -> Result<Self, CommandError> {
        LoopCommand::parse(s)
    }
}

#[derive(Clone, Copy)]
enum Verb {
    Set,
    Unset,
}

impl Verb {
    fn example(self) -> &'static str {
        match self {
            Verb::Set => "!/set(tool-loop-max-repeats=4)",
            Verb::Unset => "!/unset(tool-loop-max-repeats)",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verb::Set => "!/set",
            Verb::Unset => "!/unset",
        })
    }
}

fn parse_set(inside: &str) -> Result<LoopDetectSettings, CommandError> {
    let mut settings = LoopDetectSettings::default();
    let mut seen = Vec::with_capacity(4);
    for item in inside.split(',') {
        let (name, value) = match item.split_once('=') {
            Some((name, value)) => (name.trim(), value.trim()),
            None => (item.trim(), ""),
        };
        let key = known_key(name)?;
        if seen.contains(&key) {
            return Err(CommandError::duplicate(key));
        }
        seen.push(key);
        if value.is_empty() {
            return Err(CommandError::new(
                CommandErrorKind::MissingValue,
                Some(key),
                format!(
                    "`{key}` needs a value, as in `{key}={}`",
                    value_example(key)
                ),
            ));
        }
        let bad = |kind: CommandErrorKind| {
            move |problem: String| CommandError::new(kind, Some(key), format!("`{key}` {problem}"))
        };
        match key {
            LoopSettingKey::Detection => {
                settings.enabled = Some(parse_bool(value).map_err(bad(CommandErrorKind::BadBool))?);
            }
            LoopSettingKey::MaxRepeats => {
                settings.max_repeats =
                    Some(parse_max_repeats(value).map_err(bad(CommandErrorKind::BadNumber))?);
            }
            LoopSettingKey::Ttl => {
                settings.ttl_secs =
                    Some(parse_ttl_secs(value).map_err(bad(CommandErrorKind::BadNumber))?);
            }
            LoopSettingKey::Mode => {
                settings.mode = Some(parse_mode(value).map_err(bad(CommandErrorKind::BadMode))?);
            }
            LoopSettingKey::MaxFailures => {
                settings.max_failures =
                    Some(parse_max_repeats(value).map_err(bad(CommandErrorKind::BadNumber))?);
            }
            LoopSettingKey::PollBudget => {
                settings.poll_budget_secs =
                    Some(parse_poll_budget_secs(value).map_err(bad(CommandErrorKind::BadNumber))?);
            }
        }
    }
    Ok(settings)
}

fn parse_unset(inside: &str) -> Result<Vec<LoopSettingKey>, CommandError> {
    let mut keys = Vec::with_capacity(4);
    for item in inside.split(',') {
        let item = item.trim();
        if let Some((name, _)) = item.split_once('=') {
            let key = known_key(name.trim())?;
            return Err(CommandError::new(
                CommandErrorKind::UnexpectedValue,
                Some(key),
                format!(
                    "`!/unset` takes setting names only, got `{}`",
                    shorten(item)
                ),
            ));
        }
        let key = known_key(item)?;
        if keys.contains(&key) {
            return Err(CommandError::duplicate(key));
        }
        keys.push(key);
    }
    Ok(keys)
}

fn known_key(name: &str) -> Result<LoopSettingKey, CommandError> {
    LoopSettingKey::parse(name).ok_or_else(|| {
        let message = if name.is_empty() {
            format!("a setting name is missing; name one of {}", key_list())
        } else {
            format!(
                "unknown setting `{}`; the settings are {}",
                shorten(name),
                key_list()
            )
        };
        CommandError {
            kind: CommandErrorKind::UnknownKey,
            key: Some(shorten(name).to_owned()),
            message,
        }
    })
}

fn value_example(key: LoopSettingKey) -> &'static str {
    match key {
        LoopSettingKey::Detection => "true",
        LoopSettingKey::MaxRepeats => "4",
        LoopSettingKey::Ttl => "120",
        LoopSettingKey::Mode => "break",
        LoopSettingKey::MaxFailures => "3",
        LoopSettingKey::PollBudget => "300",
    }
}

fn key_list() -> String {
    let names: Vec<&str> = LoopSettingKey::ALL.iter().map(|k| k.as_str()).collect();
    names.join(", ")
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

/// At most 40 characters of user input, for messages.
fn shorten(text: &str) -> &str {
    match text.char_indices().nth(40) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

/// What is wrong with a command; see [`LoopCommand::parse`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandError {
    kind: CommandErrorKind,
    key: Option<String>,
    message: String,
}

/// The kind of a [`CommandError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CommandErrorKind {
    /// The text is not a `!/set(…)` or `!/unset(…)` command.
    NotACommand,
    /// The opening or closing parenthesis is missing.
    MissingParenthesis,
    /// Something follows the closing parenthesis.
    TrailingText,
    /// The parentheses name no setting.
    Empty,
    /// A setting name that loop detection does not have.
    UnknownKey,
    /// `!/set` names a setting without a value.
    MissingValue,
    /// `!/unset` gives a value.
    UnexpectedValue,
    /// A setting is named twice.
    DuplicateKey,
    /// `tool-loop-max-repeats` or `tool-loop-ttl` is not a whole number in range.
    BadNumber,
    /// `tool-loop-detection` is not `true` or `false`.
    BadBool,
    /// `tool-loop-mode` is not `break`, `chance` or `chance_then_break`.
    BadMode,
}

impl CommandError {
    fn new(kind: CommandErrorKind, key: Option<LoopSettingKey>, message: String) -> Self {
        CommandError {
            kind,
            key: key.map(|k| k.as_str().to_owned()),
            message,
        }
    }

    fn not_a_command(text: &str) -> Self {
        CommandError::new(
            CommandErrorKind::NotACommand,
            None,
            format!(
                "not a loop detection command: expected `!/set(…)` or `!/unset(…)`, got {:?}",
                shorten(text)
            ),
        )
    }

    fn duplicate(key: LoopSettingKey) -> Self {
        CommandError::new(
            CommandErrorKind::DuplicateKey,
            Some(key),
            format!("`{key}` is named twice; name it once"),
        )
    }

    /// What kind of mistake it is.
    pub fn kind(&self) -> CommandErrorKind {
        self.kind
    }

    /// The setting name involved, as written (for an unknown one) or in its canonical
    /// spelling.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The message, for the person who typed the command.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CommandError {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::LoopMode;

    #[test]
    fn every_documented_form_parses() {
        let set = |s: LoopDetectSettings| Ok(LoopCommand::Set(s));
        let cases: Vec<(&str, Result<LoopCommand, CommandError>)> = vec![
            (
                "!/set(tool-loop-detection=true)",
                set(LoopDetectSettings {
                    enabled: Some(true),
                    ..LoopDetectSettings::default()
                }),
            ),
            (
                "!/set(tool-loop-detection=false)",
                set(LoopDetectSettings {
                    enabled: Some(false),
                    ..LoopDetectSettings::default()
                }),
            ),
            (
                "  !/SET ( Tool-Loop-Max-Repeats = 4 )  ",
                set(LoopDetectSettings {
                    max_repeats: Some(4),
                    ..LoopDetectSettings::default()
                }),
            ),
            (
                "!/set(tool-loop-ttl=120)",
                set(LoopDetectSettings {
                    ttl_secs: Some(120),
                    ..LoopDetectSettings::default()
                }),
            ),
            (
                "!/set(tool-loop-mode=break)",
                set(LoopDetectSettings {
                    mode: Some(LoopMode::Break),
                    ..LoopDetectSettings::default()
                }),
            ),
            (
                "!/set(tool-loop-mode=chance)",
                set(LoopDetectSettings {
                    mode: Some(LoopMode::ChanceThenBreak),
                    ..LoopDetectSettings::default()
                }),
            ),
            (
                "!/set(tool-loop-mode=chance_then_break, tool-loop-ttl=30)",
                set(LoopDetectSettings {
                    mode: Some(LoopMode::ChanceThenBreak),
                    ttl_secs: Some(30),
                    ..LoopDetectSettings::default()
                }),
            ),
            (
                "!/unset(tool-loop-detection, tool-loop-max-repeats, tool-loop-ttl, tool-loop-mode)",
                Ok(LoopCommand::Unset(LoopSettingKey::ALL[..4].to_vec())),
            ),
            (
                "!/set(tool-loop-max-failures=3)",
                set(LoopDetectSettings {
                    max_failures: Some(3),
                    ..LoopDetectSettings::default()
                }),
            ),
            (
                "!/set( TOOL-LOOP-POLL-BUDGET-SECONDS = 300 )",
                set(LoopDetectSettings {
                    poll_budget_secs: Some(300),
                    ..LoopDetectSettings::default()
                }),
            ),
            (
                "!/set(tool-loop-poll-budget-seconds=0, tool-loop-max-failures=1000)",
                set(LoopDetectSettings {
                    poll_budget_secs: Some(0),
                    max_failures: Some(1000),
                    ..LoopDetectSettings::default()
                }),
            ),
            (
                "!/unset(tool-loop-max-failures)",
                Ok(LoopCommand::Unset(vec![LoopSettingKey::MaxFailures])),
            ),
            (
                "!/unset(tool-loop-poll-budget-seconds, tool-loop-max-failures)",
                Ok(LoopCommand::Unset(vec![
                    LoopSettingKey::PollBudget,
                    LoopSettingKey::MaxFailures,
                ])),
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(LoopCommand::parse(input), expected, "{input}");
        }
    }

    #[test]
    fn unset_falls_back_and_set_merges() {
        let start = LoopDetectSettings {
            max_repeats: Some(3),
            mode: Some(LoopMode::Break),
            ..LoopDetectSettings::default()
        };
        let set = LoopCommand::parse("!/set(tool-loop-ttl=9)").unwrap();
        let after = set.apply_to(start);
        assert_eq!(after.ttl_secs, Some(9));
        assert_eq!(after.max_repeats, Some(3));
        let unset = LoopCommand::parse("!/unset(tool-loop-max-repeats)").unwrap();
        assert_eq!(unset.apply_to(after.clone()).max_repeats, None);
        assert_eq!(unset.apply_to(after).ttl_secs, Some(9));
    }

    #[test]
    fn bad_failure_and_poll_budget_values_are_refused_naming_the_setting() {
        let failures = "`tool-loop-max-failures` must be a whole number from 2 to 1000, got";
        let budget = "`tool-loop-poll-budget-seconds` must be a whole number of seconds from 0 \
                      (no end) to 31536000, got";
        let cases = [
            (
                "!/set(tool-loop-max-failures=1)",
                CommandErrorKind::BadNumber,
                "tool-loop-max-failures",
                format!("{failures} 1"),
            ),
            (
                "!/set(tool-loop-max-failures=1001)",
                CommandErrorKind::BadNumber,
                "tool-loop-max-failures",
                format!("{failures} 1001"),
            ),
            (
                "!/set(tool-loop-max-failures=three)",
                CommandErrorKind::BadNumber,
                "tool-loop-max-failures",
                format!("{failures} \"three\""),
            ),
            (
                "!/set(tool-loop-poll-budget-seconds=-1)",
                CommandErrorKind::BadNumber,
                "tool-loop-poll-budget-seconds",
                format!("{budget} \"-1\""),
            ),
            (
                "!/set(tool-loop-poll-budget-seconds=5m)",
                CommandErrorKind::BadNumber,
                "tool-loop-poll-budget-seconds",
                format!("{budget} \"5m\""),
            ),
            (
                "!/set(tool-loop-poll-budget-seconds=31536001)",
                CommandErrorKind::BadNumber,
                "tool-loop-poll-budget-seconds",
                format!("{budget} 31536001"),
            ),
            (
                "!/set(tool-loop-max-failures)",
                CommandErrorKind::MissingValue,
                "tool-loop-max-failures",
                "`tool-loop-max-failures` needs a value, as in `tool-loop-max-failures=3`"
                    .to_owned(),
            ),
            (
                "!/unset(tool-loop-poll-budget-seconds=300)",
                CommandErrorKind::UnexpectedValue,
                "tool-loop-poll-budget-seconds",
                "`!/unset` takes setting names only, got `tool-loop-poll-budget-seconds=300`"
                    .to_owned(),
            ),
            (
                "!/unset(tool-loop-max-failures, tool-loop-max-failures)",
                CommandErrorKind::DuplicateKey,
                "tool-loop-max-failures",
                "`tool-loop-max-failures` is named twice; name it once".to_owned(),
            ),
        ];
        for (input, kind, key, message) in cases {
            let err = LoopCommand::parse(input).unwrap_err();
            assert_eq!(err.kind(), kind, "{input}: {err}");
            assert_eq!(err.key(), Some(key), "{input}");
            assert_eq!(err.message(), message, "{input}");
        }
    }

    #[test]
    fn unset_of_a_new_setting_falls_back_alone() {
        let start = LoopDetectSettings {
            max_failures: Some(2),
            poll_budget_secs: Some(60),
            max_repeats: Some(3),
            ..LoopDetectSettings::default()
        };
        let after = LoopCommand::parse("!/unset(tool-loop-max-failures)")
            .unwrap()
            .apply_to(start);
        assert_eq!(
            after,
            LoopDetectSettings {
                poll_budget_secs: Some(60),
                max_repeats: Some(3),
                ..LoopDetectSettings::default()
            }
        );
        let after = LoopCommand::parse("!/unset(tool-loop-poll-budget-seconds)")
            .unwrap()
            .apply_to(after);
        assert_eq!(
            after,
            LoopDetectSettings {
                max_repeats: Some(3),
                ..LoopDetectSettings::default()
            }
        );
    }
}
