//! The List parser on sfv's visitor API: parameters are looked at as they
//! are read, nothing but the members is stored.
use sfv::visitor::{EntryVisitor, Ignored, InnerListVisitor, ItemVisitor, ListVisitor, ParameterVisitor};
use sfv::{BareItemFromInput, KeyRef, Parser, Version};

#[derive(Debug)]
pub struct Reject;
impl std::fmt::Display for Reject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reject")
    }
}
impl std::error::Error for Reject {}

#[derive(Clone, Copy)]
enum Param {
    Int(i64),
    Other,
}

pub struct List<'k> {
    keys: [&'k str; 2],
    pub members: Vec<(String, [Option<u64>; 2])>,
}

pub struct Entry<'a, 'k> {
    list: &'a mut List<'k>,
}
pub struct Params<'a, 'k> {
    list: &'a mut List<'k>,
    name: String,
    found: [Option<Param>; 2],
}

impl<'de, 'k> ListVisitor<'de> for List<'k> {
    type Out = Vec<(String, [Option<u64>; 2])>;
    type Error = Reject;
    fn entry(&mut self) -> Result<impl EntryVisitor<'de>, Reject> {
        Ok(Entry { list: self })
    }
    fn finish(self) -> Result<Self::Out, Reject> {
        Ok(self.members)
    }
}

impl<'de, 'a, 'k> EntryVisitor<'de> for Entry<'a, 'k> {
    type Error = Reject;
    fn item(self) -> Result<impl ItemVisitor<'de>, Reject> {
        Ok(self)
    }
    fn inner_list(self) -> Result<impl InnerListVisitor<'de>, Reject> {
        Err::<Ignored, _>(Reject)
    }
}

impl<'de, 'a, 'k> ItemVisitor<'de> for Entry<'a, 'k> {
    type Out = ();
    type Error = Reject;
    fn bare_item(
        self,
        bare_item: BareItemFromInput<'de>,
    ) -> Result<impl ParameterVisitor<'de, Out = ()>, Reject> {
        let name = match bare_item {
            BareItemFromInput::String(s) => s.as_str().to_owned(),
            BareItemFromInput::Token(t) => t.as_str().to_owned(),
            _ => return Err(Reject),
        };
        Ok(Params {
            list: self.list,
            name,
            found: [None, None],
        })
    }
}

impl<'de, 'a, 'k> ParameterVisitor<'de> for Params<'a, 'k> {
    type Out = ();
    type Error = Reject;
    fn parameter(&mut self, key: &'de KeyRef, value: BareItemFromInput<'de>) -> Result<(), Reject> {
        if let Some(i) = self.list.keys.iter().position(|k| *k == key.as_str()) {
            self.found[i] = Some(match value {
                BareItemFromInput::Integer(n) => Param::Int(i64::from(n)),
                _ => Param::Other,
            });
        }
        Ok(())
    }
    fn finish(self) -> Result<(), Reject> {
        let mut out = [None, None];
        for (slot, p) in out.iter_mut().zip(self.found) {
            *slot = match p {
                Some(Param::Int(n)) => Some(u64::try_from(n).map_err(|_| Reject)?),
                _ => None,
            };
        }
        self.list.members.push((self.name, out));
        Ok(())
    }
}

/// Members of an RFC 8941 List that must all be a string or token with the
/// two parameters `keys` non-negative when they are integers.
pub fn parse(value: &[u8], keys: [&str; 2]) -> Option<Vec<(String, [Option<u64>; 2])>> {
    Parser::new(value)
        .with_version(Version::Rfc8941)
        .parse_list_with_visitor(List {
            keys,
            members: Vec::new(),
        })
        .ok()
}
