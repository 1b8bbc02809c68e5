//! What a route handler gets and gives: the request context ([`Ctx`]: the store, the
//! lifecycle effects to apply afterwards, the parsed query, path parameters and body) and the
//! successful [`Reply`]. The route table and the dispatch are in `routes`; handlers live in
//! the module of the resource they serve.

use bytes::Bytes;
use http::StatusCode;
use oxide::types;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::AddressPool;
use super::body;
use super::error::ApiError;
use super::lifecycle::{Effects, Env};
use super::names;
use super::pagination::Query;
use super::store::Store;

/// A successful reply.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub body: Bytes,
}

impl Reply {
    /// `value` as JSON with `status`.
    pub fn json<T: Serialize>(status: StatusCode, value: &T) -> Result<Self, ApiError> {
        let body = serde_json::to_vec(value).map_err(|_| ApiError::internal())?;
        Ok(Self {
            status,
            body: Bytes::from(body),
        })
    }

    /// 204 without a body.
    pub fn no_content() -> Result<Self, ApiError> {
        Ok(Self {
            status: StatusCode::NO_CONTENT,
            body: Bytes::new(),
        })
    }
}

/// Everything a handler may touch.
pub struct Ctx<'a> {
    pub store: &'a mut Store,
    pub fx: &'a mut Effects,
    pub env: &'a Env<'a>,
    pub pool: &'a AddressPool,
    pub query: &'a Query,
    pub params: &'a [String],
    pub body: &'a Bytes,
}

impl Ctx<'_> {
    /// Path parameter `i` (routes guarantee their count).
    pub fn param(&self, i: usize) -> &str {
        self.params.get(i).map(String::as_str).unwrap_or_default()
    }

    /// The optional `project` query parameter.
    pub fn project(&self) -> Option<&str> {
        self.query.get("project").map(String::as_str)
    }

    /// The required `project` query parameter of create routes.
    pub fn required_project(&self) -> Result<&str, ApiError> {
        self.project()
            .ok_or_else(|| ApiError::bad_query("missing field `project`"))
    }

    /// The JSON body as `T`, failing with dropshot's 400 (`body::parse`).
    pub fn body<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        body::parse(self.body)
    }

    /// The JSON body of a create route as `T`: nexus's type flattens the identity (`name`,
    /// `description`), which shows in its parse errors (`body::parse_create`).
    pub fn create_body<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        body::parse_create(self.body)
    }
}

/// Applies nexus's name rules to a name from a request body.
pub fn body_name(n: &types::Name) -> Result<(), ApiError> {
    names::check_name(n.as_str()).map_err(ApiError::bad_body)
}
