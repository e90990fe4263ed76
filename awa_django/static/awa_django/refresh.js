// Refreshes an admin page's live part in place: the element with data-awa-refresh="SECONDS"
// is replaced, every SECONDS, by what the page's own URL returns with ?fragment=1. Nothing is
// fetched while the tab is hidden or while the last fetch is still under way. An answer that is
// not the fragment (the session ended and the admin sent its login page, or the permission was
// taken away: 401, 403) reloads the whole page, which then shows why. A failed fetch keeps what
// is shown and tries again; after three in a row the box says since when it is not refreshed.
(function () {
  "use strict";
  const box = document.querySelector("[data-awa-refresh]");
  if (!box) {
    return;
  }
  const seconds = Math.max(Number(box.dataset.awaRefresh) || 15, 2);
  let busy = false;
  let failures = 0;
  let shownAt = new Date();
  function stale() {
    failures += 1;
    if (failures < 3) {
      return;
    }
    let note = box.querySelector(".awa-stale");
    if (!note) {
      note = document.createElement("p");
      note.className = "awa-stale errornote";
      box.prepend(note);
    }
    note.textContent = "Not refreshed since " + shownAt.toLocaleTimeString() +
      ": the server did not answer. Reload the page to try again.";
  }
  async function refresh() {
    if (document.hidden || busy) {
      return;
    }
    busy = true;
    const url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    try {
      const response = await fetch(url, { credentials: "same-origin" });
      if (response.redirected || response.status === 401 || response.status === 403) {
        window.location.reload();
        return;
      }
      if (response.ok) {
        box.innerHTML = await response.text();
        shownAt = new Date();
        box.dataset.awaRefreshed = shownAt.toISOString();
        failures = 0;
      } else {
        stale();
      }
    } catch (error) {
      // Offline, the server restarting, or a login page on another site: what is shown
      // stays, and says so after a few turns.
      stale();
    } finally {
      busy = false;
    }
  }
  window.setInterval(refresh, seconds * 1000);
})();
