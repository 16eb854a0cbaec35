/** A tiny DOM helper: the sections build their rows with it and update them in place. */

type Attrs = Record<string, string | number | boolean | null | undefined>;

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: Array<Node | string | null | undefined | false>
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) {
      continue;
    }
    if (key === 'class') {
      el.className = String(value);
    } else if (key === 'text') {
      el.textContent = String(value);
    } else {
      el.setAttribute(key, value === true ? '' : String(value));
    }
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) {
      continue;
    }
    el.append(child);
  }
  return el;
}

export function button(
  label: string,
  ariaLabel: string,
  onClick: (ev: MouseEvent) => void,
  cls = ''
): HTMLButtonElement {
  const b = h('button', {
    class: `jp-gpuaas-button jp-Button ${cls}`.trim(),
    type: 'button',
    'aria-label': ariaLabel,
    title: ariaLabel,
    text: label
  });
  b.addEventListener('click', ev => {
    ev.stopPropagation();
    onClick(ev);
  });
  return b;
}

/** A section as a landmark: <section aria-labelledby> with a heading and a body. */
export function section(id: string, title: string): {
  root: HTMLElement;
  body: HTMLElement;
  summary: HTMLElement;
} {
  const headingId = `jp-gpuaas-${id}-heading`;
  const summary = h('span', { class: 'jp-gpuaas-summary' });
  const root = h(
    'section',
    { class: `jp-gpuaas-section jp-gpuaas-${id}`, 'aria-labelledby': headingId },
    h('h2', { id: headingId, class: 'jp-gpuaas-heading' }, title, summary)
  );
  const body = h('div', { class: 'jp-gpuaas-body' });
  root.append(body);
  return { root, body, summary };
}

/** Keyed rows: add, update in place, remove, keep order; untouched rows stay as they are. */
export class Rows<T> {
  private rows = new Map<string, HTMLElement>();

  constructor(
    private readonly container: HTMLElement,
    private readonly render: (item: T, row: HTMLElement) => void,
    private readonly tag: keyof HTMLElementTagNameMap = 'li'
  ) {}

  /** Sync with `items`; redraw only rows whose key is in `only` (all when undefined). */
  sync(items: Array<[string, T]>, only?: Set<string>): void {
    const seen = new Set<string>();
    let previous: HTMLElement | null = null;
    for (const [key, item] of items) {
      seen.add(key);
      let row = this.rows.get(key);
      const fresh = !row;
      if (!row) {
        row = document.createElement(this.tag);
        row.dataset.key = key;
        this.rows.set(key, row);
      }
      if (fresh) {
        this.render(item, row);
      } else if (!only || only.has(key)) {
        this.redraw(item, row);
      }
      const expected: ChildNode | null = previous ? previous.nextSibling : this.container.firstChild;
      if (expected !== row) {
        this.container.insertBefore(row, expected);
      }
      previous = row;
    }
    for (const [key, row] of this.rows) {
      if (!seen.has(key)) {
        row.remove();
        this.rows.delete(key);
      }
    }
  }

  /**
   * Draw a row again, but touch the DOM only if it looks different: a poll or a clock tick
   * that changes nothing leaves the row (and the keyboard focus in it) alone.
   */
  private redraw(item: T, row: HTMLElement): void {
    const next = document.createElement(row.tagName);
    next.dataset.key = row.dataset.key;
    this.render(item, next);
    if (next.outerHTML === row.outerHTML) {
      return;
    }
    row.className = next.className;
    for (const name of Object.keys(row.dataset)) {
      if (!(name in next.dataset)) {
        delete row.dataset[name];
      }
    }
    Object.assign(row.dataset, next.dataset);
    // A control that had the focus keeps it across the redraw (found by its ARIA label).
    const active = document.activeElement as HTMLElement | null;
    const label = active && row.contains(active) ? active.getAttribute('aria-label') : null;
    row.replaceChildren(...Array.from(next.childNodes));
    if (label) {
      row.querySelector<HTMLElement>(`[aria-label="${CSS.escape(label)}"]`)?.focus();
    }
  }

  get size(): number {
    return this.rows.size;
  }
}
