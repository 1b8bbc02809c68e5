//! Dropshot-style pagination: `limit` (default 100, clamped to 10000), `sort_by`
//! (`name_ascending` default, `name_descending`, `id_ascending`) and opaque `page_token`s.
//!
//! Like dropshot, a page token carries the scan parameters of the first request (the sort
//! mode and the `project` selector) so that follow-up requests need only the token: the SDK's
//! `stream()` sends nothing else. `next_page` is present whenever a page is non-empty.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::error::ApiError;

/// Default page size.
pub const DEFAULT_LIMIT: usize = 100;
/// Largest page size; larger requests are clamped.
pub const MAX_LIMIT: usize = 10_000;

/// Decoded query string (keys unique).
pub type Query = BTreeMap<String, String>;

/// Sort order of a paginated list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SortMode {
    /// By name, ascending (default).
    NameAscending,
    /// By name, descending.
    NameDescending,
    /// By id, ascending.
    IdAscending,
}

impl SortMode {
    fn parse(s: &str) -> Result<Self, ApiError> {
        match s {
            "name_ascending" => Ok(Self::NameAscending),
            "name_descending" => Ok(Self::NameDescending),
            "id_ascending" => Ok(Self::IdAscending),
            other => Err(ApiError::bad_query(format!(
                "unknown variant `{other}`, expected one of `name_ascending`, \
                 `name_descending`, `id_ascending`"
            ))),
        }
    }
}

/// What the token remembers: which list, its scan parameters and where the last page ended.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Token {
    /// Token format version.
    v: u8,
    /// The list this token belongs to (a token from another list is refused).
    list: String,
    /// `project` query parameter of the first request, as given.
    project: Option<String>,
    sort_by: SortMode,
    /// Sort key of the last item of the previous page (a name or an id).
    last: String,
}

/// Parsed pagination parameters of one list request.
#[derive(Debug)]
pub struct ListParams {
    /// Page size.
    pub limit: usize,
    /// Sort order.
    pub sort: SortMode,
    /// Effective `project` selector (from the token on follow-up pages).
    pub project: Option<String>,
    /// Sort key of the last item already returned.
    after: Option<String>,
    list: &'static str,
}

impl ListParams {
    /// Parses `limit`, `sort_by`, `page_token` and `project` for the list named `list`.
    pub fn parse(list: &'static str, query: &Query) -> Result<Self, ApiError> {
        let limit = match query.get("limit") {
            None => DEFAULT_LIMIT,
            Some(s) => {
                let n: u32 = s.parse().map_err(ApiError::bad_query)?;
                if n == 0 {
                    return Err(ApiError::bad_query(
                        "invalid value: integer `0`, expected a nonzero u32",
                    ));
                }
                usize::try_from(n).unwrap_or(MAX_LIMIT).min(MAX_LIMIT)
            }
        };
        if let Some(raw) = query.get("page_token") {
            let token = decode_token(raw)?;
            if token.list != list {
                return Err(ApiError::bad_query(
                    "failed to parse pagination token: token belongs to another collection",
                ));
            }
            return Ok(Self {
                limit,
                sort: token.sort_by,
                project: token.project,
                after: Some(token.last),
                list,
            });
        }
        let sort = match query.get("sort_by") {
            None => SortMode::NameAscending,
            Some(s) => SortMode::parse(s)?,
        };
        Ok(Self {
            limit,
            sort,
            project: query.get("project").cloned(),
            after: None,
            list,
        })
    }

    /// The `project` selector, which this list requires.
    pub fn required_project(&self) -> Result<&str, ApiError> {
        self.project
            .as_deref()
            .ok_or_else(|| ApiError::bad_query("missing field `project`"))
    }

    /// Sorts `items` (name, id, value), skips what earlier pages returned and cuts one page.
    pub fn page<T>(&self, mut items: Vec<(String, Uuid, T)>) -> Page<T> {
        match self.sort {
            SortMode::NameAscending => items.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1))),
            SortMode::NameDescending => items.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1))),
            SortMode::IdAscending => items.sort_by_key(|a| a.1),
        }
        let after = self.after.as_deref();
        let selected: Vec<(String, Uuid, T)> = items
            .into_iter()
            .filter(|(name, id, _)| match (after, self.sort) {
                (None, _) => true,
                (Some(last), SortMode::NameAscending) => name.as_str() > last,
                (Some(last), SortMode::NameDescending) => name.as_str() < last,
                (Some(last), SortMode::IdAscending) => id.to_string().as_str() > last,
            })
            .take(self.limit)
            .collect();
        let next_page = selected.last().map(|(name, id, _)| {
            let last = match self.sort {
                SortMode::IdAscending => id.to_string(),
                _ => name.clone(),
            };
            encode_token(&Token {
                v: 1,
                list: self.list.to_owned(),
                project: self.project.clone(),
                sort_by: self.sort,
                last,
            })
        });
        Page {
            items: selected.into_iter().map(|(_, _, v)| v).collect(),
            next_page,
        }
    }
}

/// One page of results, serialized like dropshot's `ResultsPage` (`next_page` null when absent).
#[derive(Debug, Serialize)]
pub struct Page<T> {
    /// Items on this page.
    pub items: Vec<T>,
    /// Token for the next page; present whenever `items` is non-empty.
    pub next_page: Option<String>,
}

fn encode_token(t: &Token) -> String {
    // Serializing this plain struct cannot fail; fall back to an empty token defensively.
    let json = serde_json::to_vec(t).unwrap_or_default();
    URL_SAFE_NO_PAD.encode(json)
}

fn decode_token(raw: &str) -> Result<Token, ApiError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(raw.as_bytes())
        .map_err(|e| ApiError::bad_query(format!("failed to parse pagination token: {e}")))?;
    let token: Token = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_query(format!("failed to parse pagination token: {e}")))?;
    if token.v != 1 {
        return Err(ApiError::bad_query(
            "failed to parse pagination token: unsupported token version",
        ));
    }
    Ok(token)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Query {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn items(n: usize) -> Vec<(String, Uuid, String)> {
        (0..n)
            .map(|i| {
                let name = format!("item-{i:03}");
                (name.clone(), Uuid::new_v4(), name)
            })
            .collect()
    }

    #[test]
    fn walks_every_item_exactly_once_in_each_sort_mode() {
        let all = items(25);
        for sort in ["name_ascending", "name_descending", "id_ascending"] {
            let mut seen = Vec::new();
            let mut query = q(&[("limit", "7"), ("sort_by", sort), ("project", "p")]);
            loop {
                let lp = ListParams::parse("things", &query).unwrap();
                assert_eq!(lp.project.as_deref(), Some("p"));
                let page = lp.page(all.clone());
                if page.items.is_empty() {
                    assert!(page.next_page.is_none());
                    break;
                }
                seen.extend(page.items);
                query = q(&[("limit", "7"), ("page_token", &page.next_page.unwrap())]);
            }
            assert_eq!(seen.len(), 25, "{sort}");
            let mut dedup = seen.clone();
            dedup.sort();
            dedup.dedup();
            assert_eq!(dedup.len(), 25);
        }
    }

    #[test]
    fn limit_is_validated_and_clamped() {
        assert!(ListParams::parse("x", &q(&[("limit", "0")])).is_err());
        assert!(ListParams::parse("x", &q(&[("limit", "abc")])).is_err());
        let lp = ListParams::parse("x", &q(&[("limit", "4000000000")])).unwrap();
        assert_eq!(lp.limit, MAX_LIMIT);
        assert_eq!(
            ListParams::parse("x", &q(&[])).unwrap().limit,
            DEFAULT_LIMIT
        );
        assert!(ListParams::parse("x", &q(&[("sort_by", "newest")])).is_err());
    }

    #[test]
    fn tokens_are_bound_to_their_list_and_reject_garbage() {
        let lp = ListParams::parse("a", &q(&[("limit", "1")])).unwrap();
        let token = lp.page(items(3)).next_page.unwrap();
        assert!(ListParams::parse("b", &q(&[("page_token", &token)])).is_err());
        assert!(ListParams::parse("a", &q(&[("page_token", "!!!")])).is_err());
        assert!(ListParams::parse("a", &q(&[("page_token", "e30")])).is_err());
    }
}
