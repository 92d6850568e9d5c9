//! The admin HTTP API (JSON; errors as RFC 9457 problem details).
//!
//! Every route is declared once, in [`api`], which both builds the router
//! and lists the routes, so the OpenAPI document (`control-plane/openapi.json`, served at
//! `GET /v1/openapi.json`) can be checked against them.

mod adaptive;
pub mod auth;
mod context;
pub(crate) mod etag;
mod extract;
mod handlers;
mod modes;
mod overrides;
pub(crate) mod problem;
mod proxies;
mod quotas;
mod tenants;
mod whatif;
mod write;

use axum::extract::DefaultBodyLimit;
use axum::handler::Handler;
use axum::http::Method;
use axum::{Router, middleware, routing};

pub use context::Admin;
pub use handlers::{BucketsReply, LimitReply, LimitsReply, OPENAPI_JSON, PutLimit};

use crate::state::AppState;

/// Request bodies are tiny JSON objects; anything larger is refused (413).
pub(crate) const MAX_BODY_BYTES: usize = 64 * 1024;

/// The admin API over `state` without authentication or persistence.
pub fn router(state: AppState) -> Router {
    admin_router(Admin::in_memory(state))
}

/// The admin API.
pub fn admin_router(admin: Admin) -> Router {
    api()
        .router
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(middleware::from_fn_with_state(
            admin.auth_policy(),
            auth::require_token,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(admin)
}

/// Every route as `(method, path)`, in declaration order.
pub fn routes() -> Vec<(Method, &'static str)> {
    api().routes
}

fn api() -> Api {
    Api::default()
        .get("/healthz", handlers::healthz)
        .get("/metrics", handlers::metrics)
        .get("/v1/openapi.json", handlers::openapi)
        .get("/v1/buckets", handlers::buckets)
        .get("/v1/proxies", proxies::list)
        .get("/v1/adaptive", adaptive::list)
        .get("/v1/adaptive/{bucket}", adaptive::get)
        .put("/v1/adaptive/{bucket}", adaptive::put)
        .delete("/v1/adaptive/{bucket}", adaptive::delete)
        .get("/v1/limits", handlers::limits)
        .get("/v1/limits/{bucket}", handlers::get_limit)
        .put("/v1/limits/{bucket}", handlers::put_limit)
        .delete("/v1/limits/{bucket}", handlers::delete_limit)
        .get("/v1/tenants", tenants::list)
        .get("/v1/tenants/{tenant}", tenants::get)
        .put("/v1/tenants/{tenant}", tenants::put)
        .delete("/v1/tenants/{tenant}", tenants::delete)
        .get("/v1/modes", modes::get)
        .put("/v1/modes", modes::put)
        .put("/v1/modes/buckets/{bucket}", modes::put_bucket)
        .delete("/v1/modes/buckets/{bucket}", modes::delete_bucket)
        .put("/v1/kill-switch", modes::kill_switch_on)
        .delete("/v1/kill-switch", modes::kill_switch_off)
        .put("/v1/canary", modes::put_canary)
        .delete("/v1/canary", modes::delete_canary)
        .get("/v1/overrides", overrides::list)
        .put("/v1/overrides/limits/{bucket}", overrides::put_limit)
        .delete("/v1/overrides/limits/{bucket}", overrides::delete_limit)
        .put("/v1/overrides/tenants/{tenant}", overrides::put_tenant)
        .delete("/v1/overrides/tenants/{tenant}", overrides::delete_tenant)
        .get("/v1/quotas/{domain}", quotas::read)
        .post("/v1/whatif", whatif::replay)
}

/// A router that remembers what was routed.
#[derive(Default)]
struct Api {
    router: Router<Admin>,
    routes: Vec<(Method, &'static str)>,
}

impl Api {
    fn get<H: Handler<T, Admin>, T: 'static>(self, path: &'static str, handler: H) -> Self {
        self.add(Method::GET, path, routing::get(handler))
    }

    fn post<H: Handler<T, Admin>, T: 'static>(self, path: &'static str, handler: H) -> Self {
        self.add(Method::POST, path, routing::post(handler))
    }

    fn put<H: Handler<T, Admin>, T: 'static>(self, path: &'static str, handler: H) -> Self {
        self.add(Method::PUT, path, routing::put(handler))
    }

    fn delete<H: Handler<T, Admin>, T: 'static>(self, path: &'static str, handler: H) -> Self {
        self.add(Method::DELETE, path, routing::delete(handler))
    }

    fn add(
        mut self,
        method: Method,
        path: &'static str,
        route: routing::MethodRouter<Admin>,
    ) -> Self {
        self.routes.push((method, path));
        // Routes for the same path merge into one method router.
        self.router = self.router.route(path, route);
        self
    }
}
