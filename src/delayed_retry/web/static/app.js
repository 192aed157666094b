// Live counts over server-sent events: every element with data-live="QUEUE" shows
// that queue's message count. No inline script anywhere (the CSP forbids it).
(function () {
  "use strict";
  var url = document.body.getAttribute("data-events");
  var dot = document.getElementById("live");
  var state = document.getElementById("live-state");
  // One look for each state, whichever comes first on a load: connecting (grey), live
  // (green, counts arriving), offline (red, the stream broke; the browser retries).
  function show(name, title) {
    if (dot) { dot.className = "live " + name; dot.title = title; }
    if (state) { state.textContent = name === "on" ? "live" : name === "off" ? "offline" : "connecting"; }
  }
  if (!url || !window.EventSource) { show("off", "live counts: not supported here"); return; }
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
    show("on", "live counts as of " + data.at);
  });
  source.onerror = function () { show("off", "live counts: disconnected, retrying"); };
})();
