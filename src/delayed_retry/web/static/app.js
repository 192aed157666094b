// Live counts over server-sent events: every element with data-live="QUEUE" shows
// that queue's message count. No inline script anywhere (the CSP forbids it).
(function () {
  "use strict";
  var url = document.body.getAttribute("data-events");
  var dot = document.getElementById("live");
  if (!url || !window.EventSource) { return; }
  var source = new EventSource(url);
  source.addEventListener("counts", function (event) {
    var data = JSON.parse(event.data);
    var counts = data.counts || {};
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var name = el.getAttribute("data-live");
      if (Object.prototype.hasOwnProperty.call(counts, name)) {
        var value = counts[name];
        el.textContent = value === null ? "missing" : String(value);
      }
    });
    document.querySelectorAll("[data-live-sum]").forEach(function (el) {
      var prefix = el.getAttribute("data-live-sum");
      var total = 0;
      Object.keys(counts).forEach(function (name) {
        if (name.indexOf(prefix) === 0 && counts[name]) { total += counts[name]; }
      });
      el.textContent = String(total);
    });
    if (dot) { dot.className = "live on"; dot.title = "live: " + data.at; }
  });
  source.onerror = function () { if (dot) { dot.className = "live off"; } };
})();
