//! What a change request did: the entity, the property, the values before and after.

use serde::{Deserialize, Serialize};

use super::*;

/// A changed setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ChangeRepr")]
pub struct Change {
    /// What was changed.
    pub entity: ChangedEntity,
    /// The entity's name (`A B` for a distance, `MSR EVENT` for a
    /// subscription).
    pub name: String,
    /// The property set.
    pub property: ChangedProperty,
    /// The previous value.
    pub from: ChangeValue,
    /// The new value.
    pub to: ChangeValue,
    /// For a change to an MSR (`msr set`, `subscription set`): whether the
    /// MSR has a contact in the collector's load table now; for a change
    /// to a contact (`resource set`, `resource unset`): whether that
    /// contact is there. `false`: none such is registered (a typo, or one
    /// not started yet); the setting is kept and applies when it
    /// registers. Absent for the other entities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msr_registered: Option<bool>,
}

/// What a [`Change`] changed. On the wire: `site`, `msr`, `contact` or
/// `subscription`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangedEntity {
    /// A site (`site distance`: the name is `A B`).
    Site,
    /// An MSR (`msr set`).
    Msr,
    /// A contact (`resource set`, `resource unset`).
    Contact,
    /// An MSR's subscription (`subscription set`: the name is `MSR EVENT`).
    Subscription,
}

impl ChangedEntity {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangedEntity::Site => "site",
            ChangedEntity::Msr => "msr",
            ChangedEntity::Contact => "contact",
            ChangedEntity::Subscription => "subscription",
        }
    }
}

/// The property a [`Change`] set. On the wire: its snake-case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangedProperty {
    /// A site distance ([`ChangeValue::Distance`]).
    Distance,
    /// An MSR's performance coefficient ([`ChangeValue::Number`]).
    PerformanceCoefficient,
    /// An MSR's load limit, percent ([`ChangeValue::Count`]).
    LoadLimit,
    /// An MSR's admin active flag ([`ChangeValue::Flag`]).
    Active,
    /// A contact's zone ([`ChangeValue::Text`]).
    Zone,
    /// A contact's site ([`ChangeValue::Text`]).
    Site,
    /// A subscription's `Expires`, seconds ([`ChangeValue::Count`]).
    Expires,
}

impl ChangedProperty {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangedProperty::Distance => "distance",
            ChangedProperty::PerformanceCoefficient => "performance_coefficient",
            ChangedProperty::LoadLimit => "load_limit",
            ChangedProperty::Active => "active",
            ChangedProperty::Zone => "zone",
            ChangedProperty::Site => "site",
            ChangedProperty::Expires => "expires",
        }
    }
}

impl From<ContactProperty> for ChangedProperty {
    fn from(property: ContactProperty) -> Self {
        match property {
            ContactProperty::Zone => ChangedProperty::Zone,
            ContactProperty::Site => ChangedProperty::Site,
        }
    }
}

/// The value of a changed setting, as JSON has it: a number for a number,
/// `true`/`false` for a flag, a string for a name; a distance is a number
/// or `"infinity"` ([`Distance`]). Which one a change carries follows from
/// its [`ChangedProperty`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ChangeValue {
    /// A site distance.
    Distance(Distance),
    /// A real number (a performance coefficient).
    Number(f64),
    /// A whole number (a load limit, seconds).
    Count(u32),
    /// A flag.
    Flag(bool),
    /// A name (a zone, a site).
    Text(String),
}

/// The wire form [`Change`] is read from: the values are read as JSON
/// gives them, then typed by the property.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChangeRepr {
    entity: ChangedEntity,
    name: String,
    property: ChangedProperty,
    from: RawValue,
    to: RawValue,
    #[serde(default)]
    msr_registered: Option<bool>,
}

/// A JSON scalar, before its property says what it is.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawValue {
    Flag(bool),
    Count(u32),
    Number(f64),
    Text(String),
}

impl RawValue {
    fn typed(self, property: ChangedProperty) -> Result<ChangeValue, String> {
        use ChangedProperty as P;
        Ok(match (property, self) {
            (P::Distance, RawValue::Count(n)) => ChangeValue::Distance(Distance::Finite(n.into())),
            (P::Distance, RawValue::Number(x)) => ChangeValue::Distance(Distance::from_f64(x)),
            (P::Distance, RawValue::Text(word)) if word == "infinity" => {
                ChangeValue::Distance(Distance::Infinity)
            }
            (P::PerformanceCoefficient, RawValue::Count(n)) => ChangeValue::Number(n.into()),
            (P::PerformanceCoefficient, RawValue::Number(x)) => ChangeValue::Number(x),
            (P::LoadLimit | P::Expires, RawValue::Count(n)) => ChangeValue::Count(n),
            (P::Active, RawValue::Flag(b)) => ChangeValue::Flag(b),
            (P::Zone | P::Site, RawValue::Text(text)) => ChangeValue::Text(text),
            (property, _) => return Err(format!("{property}: a value of the wrong type")),
        })
    }
}

impl TryFrom<ChangeRepr> for Change {
    type Error = String;

    fn try_from(repr: ChangeRepr) -> Result<Self, String> {
        Ok(Change {
            entity: repr.entity,
            name: repr.name,
            property: repr.property,
            from: repr.from.typed(repr.property)?,
            to: repr.to.typed(repr.property)?,
            msr_registered: repr.msr_registered,
        })
    }
}
