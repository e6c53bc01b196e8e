//! Hearth's web console, as bytes: the page, its script and its stylesheet,
//! built from `web/` at compile time (see `build.rs`) and served by the
//! control plane at `/console/` (`hearth-control`'s `console.rs`).
//!
//! The console is a single page (hash routes: `#/`, `#/sandboxes/NAME`,
//! `#/snapshots`, `#/secrets`, `#/pools`, `#/keys`, `#/hosts`) that calls the public API with the API key
//! the user signed in with, kept in the tab's `sessionStorage` only. Asset
//! names carry a hash of their content, so they are cached for good; the
//! page itself is never cached, so a new binary's assets are picked up on
//! the next load.

use std::sync::OnceLock;

/// One built asset.
pub struct Asset {
    /// The name it is served under: `app.<hash>.js`.
    pub name: String,
    pub content_type: &'static str,
    pub bytes: &'static [u8],
}

/// The page's Content-Security-Policy. Scripts come only from the
/// console's own assets (no inline script, no `eval`); connections only to
/// the same origin (the API and its WebSockets). Styles allow inline
/// `<style>` elements because xterm.js injects its theme and cell-size
/// rules that way; no script can come in through a style.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; font-src 'self'; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// How long an asset (content-hashed name) may be cached.
pub const ASSET_CACHE_CONTROL: &str = "public, max-age=31536000, immutable";
/// The page is revalidated on every load.
pub const PAGE_CACHE_CONTROL: &str = "no-cache";

static APP_JS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/dist/app.js"));
static APP_CSS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/dist/app.css"));

/// axe-core's script, for the browser tests' accessibility check.
#[cfg(feature = "test-assets")]
pub static AXE_JS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/dist/axe.min.js"));

struct Built {
    assets: Vec<Asset>,
    page: String,
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let named = |stem: &str, ext: &str, content_type, bytes: &'static [u8]| Asset {
            name: format!("{stem}.{}.{ext}", &blake3::hash(bytes).to_hex()[..16]),
            content_type,
            bytes,
        };
        let js = named("app", "js", "text/javascript; charset=utf-8", APP_JS);
        let css = named("app", "css", "text/css; charset=utf-8", APP_CSS);
        let page = format!(
            "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <title>Hearth console</title>\n\
             <link rel=\"icon\" href=\"data:,\">\n\
             <link rel=\"stylesheet\" href=\"assets/{}\">\n\
             <script type=\"module\" src=\"assets/{}\"></script>\n\
             </head>\n<body>\n<div id=\"app\"><noscript>The Hearth console needs JavaScript.</noscript></div>\n\
             </body>\n</html>\n",
            css.name, js.name
        );
        Built {
            assets: vec![js, css],
            page,
        }
    })
}

/// The console's page (the same for every route: routing is in the page).
pub fn page() -> &'static str {
    &built().page
}

/// The asset served as `name`, if there is one.
pub fn asset(name: &str) -> Option<&'static Asset> {
    built().assets.iter().find(|a| a.name == name)
}

/// Every asset.
pub fn assets() -> &'static [Asset] {
    &built().assets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_each_asset_by_its_hash() {
        assert_eq!(assets().len(), 2);
        for a in assets() {
            assert!(page().contains(&format!("assets/{}", a.name)), "{}", a.name);
            assert!(asset(&a.name).is_some());
            assert!(!a.bytes.is_empty());
        }
        assert!(asset("app.js").is_none());
        assert!(asset("../app.js").is_none());
    }

    #[test]
    fn the_script_is_a_bundle_with_its_libraries() {
        let js = std::str::from_utf8(APP_JS).unwrap();
        // xterm.js is in the bundle, not fetched from elsewhere.
        assert!(js.contains("xterm"), "no xterm.js in the bundle");
        assert!(
            !js.contains("import(\"http"),
            "the bundle loads remote code"
        );
        let css = std::str::from_utf8(APP_CSS).unwrap();
        assert!(css.contains(".xterm"), "no xterm.css in the stylesheet");
    }
}
