// specroute: live progress of runs, and sorting/filtering of the per-prompt table. No libraries.
(function () {
  "use strict";

  function fmt(seconds) { return seconds === null || seconds === undefined ? "–" : Math.round(seconds).toString(); }

  // Poll a run's status; update the bar; reload the page when the run finishes.
  function follow(element, url, onUpdate, reloadWhenDone) {
    function tick() {
      fetch(url, { headers: { "Accept": "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (s) {
          if (!s) { return; }
          onUpdate(s);
          if (s.status === "queued" || s.status === "running") { setTimeout(tick, 1000); }
          else if (reloadWhenDone) { window.location.reload(); }
        })
        .catch(function () { setTimeout(tick, 3000); });
    }
    setTimeout(tick, 1000);
  }

  var live = document.querySelector(".live[data-status-url]");
  if (live) {
    follow(live, live.dataset.statusUrl, function (s) {
      document.getElementById("run-progress").value = s.percent;
      document.getElementById("run-count").textContent = s.done + "/" + s.total;
      document.getElementById("run-elapsed").textContent = fmt(s.elapsed_s);
      document.getElementById("run-eta").textContent = fmt(s.eta_s);
      document.getElementById("run-status").textContent = s.status;
      var chunks = s.chunks && s.chunks.chunks > 1 ? " · chunks " + s.chunks.done + "/" + s.chunks.chunks + " done, " +
          s.chunks.claimed + " being worked on, " + s.chunks.workers + " worker" + (s.chunks.workers === 1 ? "" : "s") + " so far" : "";
      document.getElementById("run-phase").textContent = (s.phase || (s.status === "queued" ? "waiting for a worker" : "")) + chunks;
    }, true);
  }

  document.querySelectorAll("tr[data-status-url]").forEach(function (row) {
    var status = row.querySelector("[data-field=status]");
    if (!status || (status.textContent !== "queued" && status.textContent !== "running")) { return; }
    follow(row, row.dataset.statusUrl, function (s) {
      status.textContent = s.status;
      status.className = "status " + s.status;
      row.querySelector("[data-field=progress]").value = s.percent;
      row.querySelector("[data-field=count]").textContent = s.done + "/" + s.total;
      row.querySelector("[data-field=elapsed]").textContent = fmt(s.elapsed_s) + " s";
      row.querySelector("[data-field=eta]").textContent = s.eta_s === null ? "" : fmt(s.eta_s) + " s";
    }, false);
  });

  // A llama-server analysis job: its status, progress line, stored generations and passes; the page reloads when it stops.
  var job = document.querySelector("#server-job[data-job-url]");
  if (job) {
    follow(job, job.dataset.jobUrl, function (s) {
      job.querySelector(".status").textContent = s.status;
      job.querySelector(".progress").textContent = (s.progress && s.progress.line) || (s.status === "queued" ? "waiting for a worker" : "");
      job.querySelector(".kept").textContent = s.kept;
      job.querySelector(".passes").textContent = s.passes;
    }, true);
  }

  // Inline handlers are not allowed by the Content-Security-Policy; these attributes replace them.
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.dataset.confirm)) { event.preventDefault(); }
    });
  });
  // The new-run form: the draft list never offers the chosen target (drafting with the target itself
  // cannot speed it up); the server refuses that pair too.
  var target = document.querySelector("#new-run select[name=target]");
  var draft = document.querySelector("#new-run select[name=draft]");
  if (target && draft) {
    var sync = function () {
      Array.prototype.forEach.call(draft.options, function (option) {
        option.disabled = option.value === target.value;
      });
      if (draft.selectedOptions.length && draft.selectedOptions[0].disabled) {
        var free = Array.prototype.find.call(draft.options, function (o) { return !o.disabled; });
        if (free) { draft.value = free.value; }
      }
    };
    target.addEventListener("change", sync);
    sync();
  }
  document.querySelectorAll("select[data-autosubmit]").forEach(function (select) {
    select.addEventListener("change", function () { select.form.submit(); });
  });

  var filter = document.getElementById("prompt-filter");
  if (filter) {
    filter.addEventListener("change", function () {
      document.querySelectorAll("#prompt-table tbody tr").forEach(function (row) {
        row.hidden = filter.value !== "" && row.dataset.promptTask !== filter.value;
      });
    });
  }

  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("th").forEach(function (th, column) {
      th.addEventListener("click", function () {
        var numeric = th.dataset.type === "num";
        var ascending = th.dataset.sorted !== "asc";
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[column].textContent.trim(), y = b.cells[column].textContent.trim();
          if (numeric) {
            var nx = parseFloat(x), ny = parseFloat(y);
            nx = isNaN(nx) ? -Infinity : nx; ny = isNaN(ny) ? -Infinity : ny;
            return ascending ? nx - ny : ny - nx;
          }
          return ascending ? x.localeCompare(y) : y.localeCompare(x);
        });
        rows.forEach(function (row) { body.appendChild(row); });
        table.querySelectorAll("th").forEach(function (other) { delete other.dataset.sorted; });
        th.dataset.sorted = ascending ? "asc" : "desc";
      });
    });
  });

  // Copy buttons: copy the text of the element data-copy names, and say so.
  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    button.addEventListener("click", function () {
      var text = document.getElementById(button.dataset.copy).textContent;
      var done = function () {
        var note = document.getElementById("export-copied");
        if (note) { note.hidden = false; setTimeout(function () { note.hidden = true; }, 2000); }
      };
      var selectAndCopy = function () {  // plain http off localhost, or a refused permission: the old way
        var range = document.createRange();
        range.selectNodeContents(document.getElementById(button.dataset.copy));
        var selection = window.getSelection();
        selection.removeAllRanges(); selection.addRange(range);
        if (document.execCommand("copy")) { done(); }
      };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(done, selectAndCopy);
      } else {
        selectAndCopy();
      }
    });
  });
})();
