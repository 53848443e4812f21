// /docs: loads the schema with the operator's token and hands it to Swagger UI.
// The token lives in this tab's sessionStorage (shared with /ui), is sent only as
// `Authorization: Bearer`, and preauthorizes Swagger UI's "Authorize" dialog, so
// "Try it out" requests carry it.  No inline script, no eval (the page's CSP).
"use strict";
(function () {
  const KEY = "kiln-token";
  const SCHEME = "bearerAuth";
  const CREATE_TOKEN = "kiln tokens create --config kiln.toml --name NAME --scope read";
  const form = document.getElementById("token-form");
  const input = document.getElementById("token-input");
  const reason = document.getElementById("token-reason");
  const status = document.getElementById("kiln-status");

  function token() {
    return sessionStorage.getItem(KEY) || "";
  }

  function headers() {
    const value = token();
    return value ? { Authorization: "Bearer " + value } : {};
  }

  function code(text) {
    const node = document.createElement("code");
    node.textContent = text;
    return node;
  }

  // One line: why the reference is empty, and how to get a token (or publish the schema).
  function askForToken(lead) {
    reason.replaceChildren(
      (lead ? lead + " " : "") + "The API reference is empty because this registry's schema" +
        " needs an API token with the read scope: create one with ",
      code(CREATE_TOKEN),
      " and paste it below (or set ",
      code("[server] public_docs = true"),
      " to publish the schema).",
    );
    form.hidden = false;
    input.focus();
  }

  // The schema says which routes need a token in prose; Swagger UI's Authorize
  // button needs a security scheme: reuse the schema's bearer scheme, else add one.
  function bearerScheme(spec) {
    spec.components = spec.components || {};
    const schemes = (spec.components.securitySchemes = spec.components.securitySchemes || {});
    for (const [name, scheme] of Object.entries(schemes)) {
      if (scheme && scheme.type === "http" && String(scheme.scheme).toLowerCase() === "bearer") {
        return name;
      }
    }
    schemes[SCHEME] = { type: "http", scheme: "bearer", description: "A kiln-registry token" };
    for (const [path, operations] of Object.entries(spec.paths || {})) {
      if (path === "/health") continue;
      for (const operation of Object.values(operations)) {
        if (operation && typeof operation === "object" && !operation.security) {
          operation.security = [{ [SCHEME]: [] }];
        }
      }
    }
    return SCHEME;
  }

  function render(spec) {
    const scheme = bearerScheme(spec);
    const ui = window.SwaggerUIBundle({
      spec: spec,
      dom_id: "#swagger-ui",
      deepLinking: false,
      validatorUrl: null,
      displayOperationId: true,
      docExpansion: "list",
      defaultModelsExpandDepth: 0,
      requestInterceptor: function (request) {
        // A token set with "Authorize" is kept for /ui too (same tab).
        const sent = request.headers && request.headers.Authorization;
        if (typeof sent === "string" && sent.startsWith("Bearer ")) {
          sessionStorage.setItem(KEY, sent.slice(7));
        }
        return request;
      },
    });
    if (token()) {
      ui.preauthorizeApiKey(scheme, token());
    }
    status.textContent = "";
  }

  async function load() {
    status.textContent = "loading /openapi.json";
    let response;
    try {
      response = await fetch("/openapi.json", { headers: headers(), credentials: "omit", cache: "no-store" });
    } catch (err) {
      status.textContent = "the registry did not answer: " + err;
      return;
    }
    if (response.status === 401 || response.status === 403) {
      let message = "refused";
      try {
        message = (await response.json()).error.message;
      } catch (err) {
        // keep the generic message
      }
      status.textContent = "";
      askForToken(token() ? "The registry refused this token (" + message + ")." : "");
      return;
    }
    if (!response.ok) {
      status.textContent = "GET /openapi.json answered " + response.status;
      return;
    }
    form.hidden = true;
    render(await response.json());
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    sessionStorage.setItem(KEY, input.value.trim());
    input.value = "";
    load();
  });
  load();
})();
