(function () {
  "use strict";
  var tip = document.getElementById("tip");
  // The <title> children are the no-script fallback; with the script running, one tooltip is enough.
  document.querySelectorAll("svg [data-tip] > title").forEach(function (title) { title.remove(); });
  function showTip(text, ev) {
    tip.textContent = text;
    tip.style.display = "block";
    var x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    tip.style.left = x + "px";
    tip.style.top = (ev.clientY + 16) + "px";
  }
  document.addEventListener("mousemove", function (ev) {
    var el = ev.target.closest ? ev.target.closest("[data-tip]") : null;
    if (el) { showTip(el.getAttribute("data-tip"), ev); } else { tip.style.display = "none"; }
  });

  function cellValue(row, index) {
    var cell = row.cells[index];
    var raw = cell.getAttribute("data-v");
    if (raw === null) { return cell.textContent.toLowerCase(); }
    var num = Number(raw);
    return isNaN(num) ? raw.toLowerCase() : num;
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("th").forEach(function (th, index) {
      th.addEventListener("click", function () {
        var body = table.tBodies[0];
        var descending = th.getAttribute("aria-sort") !== "descending";
        table.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", descending ? "descending" : "ascending");
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = cellValue(a, index), y = cellValue(b, index);
          var order = x < y ? -1 : x > y ? 1 : 0;
          return descending ? -order : order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });

  var SVG = "http://www.w3.org/2000/svg";
  var COLORS = ["#f2a65a", "#eec170", "#f28e2b", "#e9c46a", "#f4a261", "#e76f51", "#ffb55a", "#ffd07b"];
  function hash(name) {
    var h = 0;
    for (var i = 0; i < name.length; i++) { h = (h * 31 + name.charCodeAt(i)) | 0; }
    return Math.abs(h);
  }
  function flameGraph(svg, root, unit) {
    var rowH = 18, width = 1060, depth = 0;
    (function walk(node, d) {
      node.depth = d; depth = Math.max(depth, d);
      (node.children || []).forEach(function (child) { child.parent = node; walk(child, d + 1); });
    })(root, 0);
    svg.setAttribute("viewBox", "0 0 " + width + " " + (depth + 1) * rowH);
    function draw(focus) {
      while (svg.firstChild) { svg.removeChild(svg.firstChild); }
      var scale = width / (focus.value || 1);
      function place(node, x) {
        var w = node.value * scale;
        if (w < 0.3) { return; }
        var g = document.createElementNS(SVG, "g");
        var rect = document.createElementNS(SVG, "rect");
        rect.setAttribute("x", x); rect.setAttribute("y", node.depth * rowH);
        rect.setAttribute("width", Math.max(w, 0.5)); rect.setAttribute("height", rowH - 1);
        rect.setAttribute("fill", node.depth < focus.depth ? "#d5d8dc" : COLORS[hash(node.name) % COLORS.length]);
        var share = (100 * node.value / (root.value || 1)).toFixed(1);
        var parentShare = node.parent ? (100 * node.value / (node.parent.value || 1)).toFixed(1) + "% of parent, " : "";
        rect.setAttribute("data-tip", node.name + " \u2014 " + node.value.toFixed(2) + " " + unit + " (" + parentShare + share + "% of all)");
        rect.addEventListener("click", function () { draw(node === focus && node.parent ? node.parent : node); });
        g.appendChild(rect);
        if (w > 40) {
          var text = document.createElementNS(SVG, "text");
          text.setAttribute("x", x + 3); text.setAttribute("y", node.depth * rowH + 13);
          var chars = Math.floor((w - 6) / 6.5);
          text.textContent = node.name.length > chars ? node.name.slice(0, Math.max(chars - 1, 1)) + "\u2026" : node.name;
          g.appendChild(text);
        }
        svg.appendChild(g);
        var cx = x;
        (node.children || []).forEach(function (child) { place(child, cx); cx += child.value * scale; });
      }
      var ancestors = [], up = focus.parent;
      while (up) { ancestors.unshift(up); up = up.parent; }
      ancestors.forEach(function (node) {
        var save = node.children; node.children = []; place(node, 0); node.children = save;
      });
      place(focus, 0);
    }
    draw(root);
    var reset = document.getElementById("flame-reset");
    if (reset) { reset.addEventListener("click", function () { draw(root); }); }
  }
  var data = document.getElementById("flame-data");
  var flame = document.getElementById("flame");
  if (data && flame) {
    var payload = JSON.parse(data.textContent);
    flameGraph(flame, payload.tree, payload.unit);
  }
})();
