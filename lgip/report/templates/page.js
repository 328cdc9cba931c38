(function () {
  "use strict";
  var each = function (list, fn) { Array.prototype.forEach.call(list, fn); };

  // A thumbnail shown by several cards is in the page once: the others take its source.
  each(document.querySelectorAll("img[data-same]"), function (img) {
    var first = document.getElementById(img.dataset.same);
    if (first) img.src = first.src;
  });

  // The results table: a click on a header sorts the rows by that column, best first (a second
  // click reverses); rows without the figure stay last, ties keep the page's order.
  var table = document.getElementById("results");
  var allColumns = document.getElementById("all-columns");
  if (table && allColumns) {  // the headline columns, or all of them
    var label = allColumns.textContent;
    allColumns.addEventListener("click", function () {
      var all = table.classList.toggle("headline") === false;
      allColumns.setAttribute("aria-pressed", all ? "true" : "false");
      allColumns.textContent = all ? "Show the headline columns" : label;
    });
  }
  if (table) {
    var heads = table.tHead.rows[0].cells;
    var body = table.tBodies[0];
    each(body.rows, function (row, i) { row.dataset.order = i; });
    each(heads, function (th, col) {
      th.querySelector("button").addEventListener("click", function () {
        var first = th.dataset.better === "high" ? "descending" : "ascending";
        var current = th.getAttribute("aria-sort");
        var dir = current === "none" ? first : (current === "ascending" ? "descending" : "ascending");
        each(heads, function (h) { h.setAttribute("aria-sort", "none"); });
        th.setAttribute("aria-sort", dir);
        var numeric = th.classList.contains("num");
        var sign = dir === "ascending" ? 1 : -1;
        var rows = Array.prototype.slice.call(body.rows);
        var key = function (row) {
          var v = row.cells[col].dataset.v;
          return v === "" || v === undefined ? null : (numeric ? parseFloat(v) : v.toLowerCase());
        };
        rows.sort(function (a, b) {
          var x = key(a), y = key(b);
          if (x === null || y === null) {
            if (x === y) return a.dataset.order - b.dataset.order;
            return x === null ? 1 : -1;
          }
          if (x < y) return -sign;
          if (x > y) return sign;
          return a.dataset.order - b.dataset.order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  }

  // The galleries: "All models" shows the top K over all models, a model its own top K; the
  // flip type narrows the flips. Cards are ordered (and numbered) by their rank in the list shown.
  var model = "", modelLabel = "";
  var galleries = document.querySelectorAll("section.gallery");
  var apply = function () {
    each(galleries, function (sec) {
      var type = sec.dataset.type || "", shown = 0, scored = 0, listed = 0;
      each(sec.querySelectorAll(".card"), function (card) {
        var rank = model ? (card.dataset.model === model ? card.dataset.rankModel : "") : card.dataset.rankAll;
        var ok = rank !== "" && (!type || card.dataset.type === type);
        card.hidden = !ok;
        if (rank !== "") listed += 1;
        if (ok) {
          card.style.order = rank;
          card.querySelector(".rank").textContent = "#" + rank;
          shown += 1;
          if (card.querySelector(".blame")) scored += 1;
        }
      });
      // each count says what it counts: the cards shown, out of which list, and (flips) how many
      // of them carry explain_flips.py's word scores
      var what = sec.dataset.what;  // "flips", "paraphrases", "altered images"
      var k = +sec.dataset.topK;
      // (one model: no model filter, and "over all models" would say more than there is)
      var scope = model ? " of " + modelLabel : document.getElementById("model-filter")
        ? (sec.dataset.scope || " over all models") : "";
      var unit = function (n, plural) { return n + " " + (n === 1 ? plural.slice(0, -1) : plural); };
      sec.querySelector(".status").textContent = unit(shown, what) + " shown: "
        + (type ? "the " + type + " " + what + " among the top " + k + scope
           : listed < k ? "every " + what.slice(0, -1) + scope + sec.dataset.every
             + " (fewer than " + k + ")" : "the top " + k + scope)
        + (sec.querySelector(".legend") ? "; " + scored + " of them with word scores" : "") + ".";
      var empty = sec.querySelector(".empty");
      empty.hidden = shown > 0;
      if (!shown) empty.textContent = "Nothing to show: no " + (type ? type + " " : "") + what.slice(0, -1) + " in the top "
        + sec.dataset.topK + scope + ".";
    });
  };
  var press = function (buttons, pressed) {
    each(buttons, function (b) { b.setAttribute("aria-pressed", b === pressed ? "true" : "false"); });
  };
  var modelButtons = document.querySelectorAll("button.f-model");
  each(modelButtons, function (b) {
    b.addEventListener("click", function () {
      model = b.dataset.model;
      modelLabel = b.textContent;
      press(modelButtons, b);
      apply();
    });
  });
  each(galleries, function (sec) {
    var typeButtons = sec.querySelectorAll("button.f-type");
    each(typeButtons, function (b) {
      b.addEventListener("click", function () {
        sec.dataset.type = b.dataset.type;
        press(typeButtons, b);
        apply();
      });
    });
  });
  if (galleries.length) apply();
})();
