(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("memfit-data").textContent);
  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
  function fmt(b) {
    var sign = b < 0 ? "-" : "", m = Math.abs(b);
    if (m < 1024) return sign + m + " B";
    var u = 1;
    while (u + 1 < UNITS.length && m >= Math.pow(1024, u + 1)) u++;
    for (;; u++) {
      var h = Math.floor((m * 100) / Math.pow(1024, u) + 0.5);
      if (h >= 102400 && u + 1 < UNITS.length) continue;
      var c = h % 100;
      return sign + Math.floor(h / 100) + "." + (c < 10 ? "0" : "") + c + " " + UNITS[u];
    }
  }
  function exact(b) { return b.toLocaleString("en-US") + " B"; }
  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  var plot = data.plot, tip = document.getElementById("tip");
  var host = document.getElementById("stacked");
  var svg = host ? host.querySelector("svg") : null;
  if (!svg || !tip || plot.points.length < 2) return;
  var NS = "http://www.w3.org/2000/svg";
  var cursor = document.createElementNS(NS, "line");
  cursor.setAttribute("y1", plot.area.y);
  cursor.setAttribute("y2", plot.area.y + plot.area.h);
  cursor.setAttribute("stroke", "#222");
  cursor.setAttribute("stroke-dasharray", "3 3");
  cursor.setAttribute("visibility", "hidden");
  svg.appendChild(cursor);
  function phaseAt(x) {
    var name = "";
    plot.bands.forEach(function (b) {
      if (b.x <= x && x <= b.x + b.w) name = b.phase + " " + b.iteration;
    });
    return name;
  }
  function total(p) {
    var sum = 0;
    for (var k = 3; k < p.length; k++) sum += p[k];
    return sum;
  }
  function hide() { tip.hidden = true; cursor.setAttribute("visibility", "hidden"); }
  function show(i, ev) {
    var p = plot.points[i], sum = total(p), rows = "";
    plot.stack_order.slice().reverse().forEach(function (c) {
      var b = p[3 + c];
      if (b === 0) return;
      var cat = plot.categories[c];
      rows += "<tr data-category=\"" + cat.name + "\" data-bytes=\"" + b + "\"><td>" +
        "<span class=\"sw\" style=\"background:" + cat.color + "\"></span>" +
        esc(cat.label) + "</td><td>" + fmt(b) + "</td><td>" + exact(b) + "</td></tr>";
    });
    var where = p[1] < 0 ? "start" : "after event " + p[1];
    if (plot.x_axis === "time" && p[1] >= 0) {
      where += " at " + ((p[2] - plot.points[0][2]) / 1e6).toFixed(3) + " ms";
    }
    tip.innerHTML = "<b>" + esc(phaseAt(p[0])) + "</b> " + esc(where) +
      "<table><tr data-total=\"" + sum + "\"><td><b>total</b></td><td><b>" + fmt(sum) +
      "</b></td><td>" + exact(sum) + "</td></tr>" + rows + "</table>";
    tip.hidden = false;
    var left = ev.pageX + 14;
    if (left + tip.offsetWidth > window.scrollX + document.documentElement.clientWidth) {
      left = ev.pageX - 14 - tip.offsetWidth;
    }
    tip.style.left = left + "px";
    tip.style.top = ev.pageY + 14 + "px";
    cursor.setAttribute("x1", p[0]);
    cursor.setAttribute("x2", p[0]);
    cursor.setAttribute("visibility", "visible");
  }
  svg.addEventListener("mousemove", function (ev) {
    var r = svg.getBoundingClientRect();
    var x = (ev.clientX - r.left) * plot.width / r.width;
    if (x < plot.area.x || x > plot.area.x + plot.area.w) { hide(); return; }
    var pts = plot.points, lo = 0, hi = pts.length - 1;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (pts[mid][0] <= x) lo = mid; else hi = mid - 1;
    }
    // Many events can share a pixel: show the highest within 1.5 px, so a
    // spike one pixel wide is what the cursor finds.
    var best = lo, i;
    for (i = lo; i >= 0 && pts[i][0] >= x - 1.5; i--) {
      if (total(pts[i]) > total(pts[best])) best = i;
    }
    for (i = lo + 1; i < pts.length && pts[i][0] <= x + 1.5; i++) {
      if (total(pts[i]) > total(pts[best])) best = i;
    }
    show(best, ev);
  });
  svg.addEventListener("mouseleave", hide);
})();
