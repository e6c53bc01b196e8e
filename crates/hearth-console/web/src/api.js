// The public API as the console uses it: the API key the user signed in
// with (kept in this tab's sessionStorage only, never in a cookie or
// localStorage), LangSmith's error envelope turned into one sentence, and a
// refused key signing the user out.

const KEY = "hearth.apiKey";

export const session = {
  key: () => sessionStorage.getItem(KEY),
  signIn: (key) => sessionStorage.setItem(KEY, key),
  signOut: () => sessionStorage.removeItem(KEY),
};

/** An API error, with the message a user can act on. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** The envelope's message: `{detail: {message}}` or a validation list. */
export function messageOf(status, body) {
  const detail = body && body.detail;
  if (Array.isArray(detail) && detail.length) {
    return detail
      .map((d) => {
        const loc = (d.loc || []).filter((s) => s !== "body").join(".");
        return loc ? `${loc}: ${d.msg}` : d.msg;
      })
      .join("; ");
  }
  if (detail && typeof detail === "object" && detail.message) return detail.message;
  if (typeof detail === "string") return detail;
  if (body && body.message) return body.message;
  return `the server answered ${status}`;
}

const listeners = new Set();
/** Called with a message when the server refuses the key (401). */
export function onSignedOut(f) {
  listeners.add(f);
  return () => listeners.delete(f);
}

function refused(message) {
  session.signOut();
  for (const f of listeners) f(message);
}

/**
 * Calls the API. `body` is sent as JSON (or as is when it is FormData);
 * the answer is parsed as JSON unless `raw` is set (then the Response).
 */
export async function api(method, path, { body, raw, key } = {}) {
  const headers = { "X-Api-Key": key || session.key() || "" };
  let payload;
  if (body instanceof FormData) {
    payload = body;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, { method, headers, body: payload });
  } catch (e) {
    throw new ApiError(0, `cannot reach Hearth (${e.message})`);
  }
  if (!resp.ok) {
    let parsed = null;
    try {
      parsed = await resp.json();
    } catch (_) {
      // not JSON: the status says it all
    }
    const message = messageOf(resp.status, parsed);
    if (resp.status === 401 && !key) {
      refused(`Signed out: ${message}. Your API key was refused (wrong or revoked).`);
    }
    throw new ApiError(resp.status, message);
  }
  if (raw) return resp;
  if (resp.status === 204) return null;
  const text = await resp.text();
  return text ? JSON.parse(text) : null;
}

export const boxes = "/api/v2/sandboxes/boxes";
export const enc = encodeURIComponent;
