// The page's contents list follows the reading: the section whose heading was passed last is
// the one marked. The theme's own scroll-spy measures the page when it loads, before the
// figures are drawn; this one looks at where the headings are at each scroll.
(function () {
  function follow() {
    const links = Array.from(document.querySelectorAll("nav.page-toc a.nav-link[href^='#']"));
    if (!links.length) return;
    const targets = links
      .map((a) => [a, document.getElementById(decodeURIComponent(a.hash.slice(1)))])
      .filter(([, el]) => el);
    let current = targets[0];
    const line = window.innerHeight * 0.25;
    for (const t of targets) {
      if (t[1].getBoundingClientRect().top <= line) current = t;
    }
    // at the bottom of the page, the last section is the one being read
    if (window.innerHeight + window.scrollY >= document.body.scrollHeight - 2) {
      current = targets[targets.length - 1];
    }
    for (const [a] of targets) {
      const on = a === current[0];
      a.classList.toggle("active", on);
      a.parentElement.classList.toggle("active", on);
    }
  }
  let queued = false;
  function soon() {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      follow();
    });
  }
  document.addEventListener("scroll", soon, { passive: true });
  window.addEventListener("load", follow);
  window.addEventListener("resize", soon);
})();
