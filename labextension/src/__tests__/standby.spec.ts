/**
 * The controller on standby: a hidden panel with nothing of mine live polls nothing; a
 * hidden browser tab closes the event stream and polls nothing; shown again, one fresh
 * read. (That the panel never makes a GPU kernel busy is checked in the browser: the
 * Galata cull-warning test.) And the event stream itself: one that opens while the gateway
 * behind the server is still down is not left open and unlive.
 *
 * Node has no DOM: `document` (its visibility), `window` and `EventSource` are stubbed
 * before the controller (and @lumino/polling, which reads `document` on load) is required.
 */

jest.mock('../api', () => ({
  ApiError: class ApiError extends Error {
    status = 0;
    get unreachable(): boolean {
      return true;
    }
  }
}));

type Listener = () => void;
const docListeners: Record<string, Listener[]> = {};
const doc = {
  visibilityState: 'visible',
  get hidden(): boolean {
    return this.visibilityState === 'hidden';
  },
  cookie: '',
  addEventListener(name: string, fn: Listener): void {
    (docListeners[name] ??= []).push(fn);
  },
  removeEventListener(name: string, fn: Listener): void {
    docListeners[name] = (docListeners[name] ?? []).filter(f => f !== fn);
  }
};
function setTabHidden(hidden: boolean): void {
  doc.visibilityState = hidden ? 'hidden' : 'visible';
  (docListeners['visibilitychange'] ?? []).forEach(fn => fn());
}

class FakeEventSource {
  static all: FakeEventSource[] = [];
  closed = false;
  onopen: (() => void) | null = null;
  onerror: (() => void) | null = null;
  onmessage: ((e: unknown) => void) | null = null;
  constructor(readonly url: string) {
    FakeEventSource.all.push(this);
  }
  addEventListener(): void {}
  close(): void {
    this.closed = true;
  }
}
const g = globalThis as Record<string, unknown>;
g.document = doc;
g.window = globalThis;
g.EventSource = FakeEventSource;

// Required only now, after the stubs (an import would be hoisted above them).
const { GpuController } = jest.requireActual<typeof import('../controller')>('../controller');
const { GpuModel } = jest.requireActual<typeof import('../model')>('../model');
const { EventConnection } = jest.requireActual<typeof import('../connection')>('../connection');

const ME = { name: 'alice', groups: ['vision'], use: true, view: false, admin: false, tenants: ['vision'] };

/** The API the controller gets: each call is recorded by name. */
function fakeApi(calls: string[]): any {
  const record =
    <T>(name: string, value: T) =>
    async (): Promise<T> => {
      calls.push(name);
      return value;
    };
  return {
    me: record('me', ME),
    requests: record('requests', []),
    tenants: record('tenants', { simulated: true, tenants: [] }),
    devices: record('devices', { simulated: true, devices: [] }),
    kernels: record('kernels', []),
    jobs: record('jobs', []),
    logTail: record('logTail', ''),
    eventsUrl: () => '/gpuaas/api/events'
  };
}

async function settle(ms: number): Promise<void> {
  await jest.advanceTimersByTimeAsync(ms);
}

// Every test: fake timers, no stream yet, the tab shown.
beforeEach(() => {
  jest.useFakeTimers();
  FakeEventSource.all = [];
  doc.visibilityState = 'visible';
});
afterEach(() => {
  jest.useRealTimers();
});

describe('the controller stands by', () => {
  it('polls only while the panel is shown, and nothing while the tab is hidden', async () => {
    const calls: string[] = [];
    const controller = new GpuController({
      api: fakeApi(calls),
      model: new GpuModel(),
      notebooks: () => new Map(),
      notify: () => undefined,
      devicesInterval: 1
    });
    controller.start();
    await settle(100);
    expect(calls).toContain('me'); // the first read
    expect(FakeEventSource.all).toHaveLength(1);
    const stream = FakeEventSource.all[0];

    // Panel hidden, nothing of mine live: the local poll stands by.
    calls.length = 0;
    await settle(10_000);
    expect(calls).toEqual([]);

    // Shown: device samples, kernels and jobs every second.
    controller.setPanelVisible(true);
    await settle(5_000);
    const shown = calls.filter(c => c === 'devices').length;
    expect(shown).toBeGreaterThanOrEqual(4);
    expect(calls).toContain('kernels');

    // The browser tab hidden (panel still shown): the stream is closed, nothing is read.
    setTabHidden(true);
    expect(stream.closed).toBe(true);
    calls.length = 0;
    await settle(20_000);
    expect(calls).toEqual([]);
    expect(FakeEventSource.all).toHaveLength(1); // not reopened while hidden

    // Visible again: the stream reopens, and a fresh read once it is open.
    setTabHidden(false);
    expect(FakeEventSource.all).toHaveLength(2);
    FakeEventSource.all[1].onopen!();
    await settle(1_500);
    expect(calls).toContain('requests');

    // The panel hidden again: back to standby.
    controller.setPanelVisible(false);
    await settle(2_000);
    calls.length = 0;
    await settle(10_000);
    expect(calls).toEqual([]);
    controller.dispose();
  });

});

describe('the event stream', () => {
  it('opened while the gateway is down, it is dropped and opened again, then goes live', async () => {
    // The server's proxy answers the stream at once, whether the gateway behind it is up or
    // not; the server reconnects to the gateway by itself, so that stream may stay open.
    let gatewayUp = false;
    const states: string[] = [];
    const connection = new EventConnection({
      url: () => '/gpuaas/api/events',
      onEvent: () => undefined,
      reload: async () => {
        if (!gatewayUp) {
          throw new Error('GPU service unreachable — retrying.');
        }
      },
      onState: state => states.push(state)
    });
    connection.start();
    await settle(10);
    expect(FakeEventSource.all).toHaveLength(1);
    FakeEventSource.all[0].onopen!(); // open, but its fresh read fails
    await settle(10);
    expect(states[states.length - 1]).toBe('unreachable');
    expect(FakeEventSource.all[0].closed).toBe(true); // not left open, never to be live

    gatewayUp = true;
    await settle(1_100); // the first reconnect comes after 1 s
    expect(FakeEventSource.all).toHaveLength(2);
    FakeEventSource.all[1].onopen!();
    await settle(10);
    expect(states[states.length - 1]).toBe('live');
    expect(FakeEventSource.all[1].closed).toBe(false);
    connection.dispose();
  });

  it('a poll still in flight when the stream goes live does not take it back', async () => {
    const reads: Array<() => void> = [];
    const states: string[] = [];
    const connection = new EventConnection({
      url: () => '/gpuaas/api/events',
      onEvent: () => undefined,
      // Each read answers only when the test says so, in the order it chooses.
      reload: () => new Promise<void>(resolve => reads.push(resolve)),
      onState: state => states.push(state)
    });
    connection.start();
    reads.shift()!(); // the first read
    FakeEventSource.all[0].onerror!(); // the stream drops: the fallback poll reads
    await settle(10);
    const polled = reads.shift()!; // ... and its answer is slow
    await settle(1_100); // the stream opens again, and its fresh read is quick
    FakeEventSource.all[1].onopen!();
    await settle(10);
    reads.shift()!();
    await settle(10);
    expect(states[states.length - 1]).toBe('live');
    polled(); // the slow poll answers only now
    await settle(10);
    expect(states[states.length - 1]).toBe('live');
    connection.dispose();
  });
});
