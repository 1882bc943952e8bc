// The cockpit's only script: live fragments from the page's event stream, and the action buttons.
// Fragments are HTML rendered (and escaped) by the server's templates; buttons POST with the
// session's CSRF token from the page's <meta> tag.
(function () {
  "use strict";
  var meta = document.querySelector('meta[name="csrf-token"]');
  var csrf = meta ? meta.content : "";
  var live = document.getElementById("live");

  var url = document.body.dataset.events;
  if (url && window.EventSource) {
    var es = new EventSource(url);
    es.addEventListener("open", function () { live.textContent = "live"; live.className = "live on"; });
    es.addEventListener("error", function () { live.textContent = "reconnecting…"; live.className = "live off"; });
    es.addEventListener("update", function (ev) {
      var parts = JSON.parse(ev.data);
      Object.keys(parts).forEach(function (id) {
        var el = document.getElementById(id);
        if (el) { el.innerHTML = parts[id]; }
      });
      document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
    });
  }

  document.addEventListener("click", function (ev) {
    var b = ev.target.closest("button[data-post]");
    if (!b) { return; }
    b.disabled = true;
    var out = document.getElementById("action-result");
    fetch(b.dataset.post, { method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": csrf } })
      .then(function (r) {
        return r.json().catch(function () { return { error: r.status + " " + r.statusText }; })
          .then(function (body) {
            out.textContent = body.message || body.error || "";
            out.className = r.ok ? "ok" : "error";
          });
      })
      .catch(function (e) { out.textContent = String(e); out.className = "error"; })
      .finally(function () { b.disabled = false; });
  });
})();
