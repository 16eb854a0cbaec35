/**
 * Live updates: the gateway's events through the server's `/gpuaas/api/events` proxy
 * (EventSource). When the stream drops, a @lumino/polling Poll rereads the state until the
 * stream is back; reconnects back off (1 s, 2 s, 4 s... 30 s). While the browser tab is
 * hidden the stream is closed and polls stand by; it reopens with a fresh read.
 *
 * Nothing here talks to a kernel: the panel never counts as kernel activity.
 */

import { Poll } from '@lumino/polling';

import type { GatewayEvent } from './types';

/** The gateway's event names (INTERFACES.md and the core's decisions). */
export const EVENT_NAMES = [
  'submit',
  'queue',
  'admit',
  'preempt',
  'preempt_warning',
  'preempt_withdrawn',
  'cull',
  'cull_warning',
  'resume',
  'park',
  'expire',
  'requeue',
  'finish',
  'cancel',
  'reject',
  'scale_up',
  'node_ready',
  'scale_down',
  'update',
  'reset'
];

export interface ConnectionOptions {
  url: () => string;
  onEvent: (event: GatewayEvent) => void;
  /** Read the whole state again (on open, on reconnect, while polling). */
  reload: () => Promise<void>;
  onState: (state: 'live' | 'polling' | 'unreachable', error?: string) => void;
  /** Seconds between polls while the stream is down. */
  pollInterval?: number;
}

export class EventConnection {
  private source: EventSource | null = null;
  private retry = 1000;
  private timer: number | null = null;
  private disposed = false;
  /** Said live (a stream open with a fresh read behind it): a poll or a first read still
   * in flight then has nothing to say about the connection. */
  private live = false;
  private readonly poll: Poll;

  constructor(private readonly options: ConnectionOptions) {
    this.poll = new Poll({
      auto: false,
      factory: async () => {
        try {
          await options.reload();
          if (!this.live) {
            options.onState('polling');
          }
        } catch (e) {
          if (!this.live) {
            options.onState('unreachable', (e as Error).message);
          }
          throw e;
        }
      },
      frequency: {
        interval: (options.pollInterval ?? 5) * 1000,
        backoff: true,
        max: 30 * 1000
      },
      name: 'jupyter-gpuaas:fallback',
      standby: 'when-hidden'
    });
    document.addEventListener('visibilitychange', this.onVisibility);
  }

  /** Read the state now (the stream may open only at its first event), then listen. */
  start(): void {
    this.options.reload().catch(e => {
      if (!this.live) {
        this.options.onState('unreachable', (e as Error).message);
        void this.poll.start();
      }
    });
    this.open();
  }

  private onVisibility = (): void => {
    if (document.hidden) {
      this.close();
    } else if (!this.source && !this.disposed) {
      this.open();
    }
  };

  private open(): void {
    if (this.disposed || document.hidden) {
      return;
    }
    this.close();
    const source = new EventSource(this.options.url(), { withCredentials: true });
    this.source = source;
    source.onopen = () => {
      // Open is not enough (the server's proxy answers before it reaches the gateway):
      // live once a fresh read succeeds; only then is the backoff reset.
      this.options
        .reload()
        .then(() => {
          if (this.source !== source) {
            return; // dropped meanwhile: its successor says when it is live
          }
          this.retry = 1000;
          this.live = true;
          void this.poll.stop();
          this.options.onState('live');
        })
        .catch(e => {
          if (this.source !== source) {
            return; // dropped meanwhile: its successor says how the connection is
          }
          this.options.onState('unreachable', (e as Error).message);
          // The gateway did not answer behind an open stream. The stream may well stay
          // open while the gateway comes back (the server reconnects to it by itself), and
          // nothing would then ever say it is live: drop it and open again, with backoff.
          this.dropped();
        });
    };
    const handle = (name: string) => (msg: MessageEvent) => {
      let data: GatewayEvent['data'] = {};
      try {
        data = JSON.parse(msg.data);
      } catch {
        return; // not JSON: nothing a row could show
      }
      this.options.onEvent({ name, data });
    };
    for (const name of EVENT_NAMES) {
      source.addEventListener(name, handle(name) as EventListener);
    }
    source.onmessage = handle('message');
    source.onerror = () => {
      if (this.source === source) {
        this.dropped();
      }
    };
  }

  /** The stream dropped, never opened, or opened without a gateway behind it: poll
   * meanwhile, and open it again with backoff. */
  private dropped(): void {
    this.close();
    void this.poll.start();
    void this.poll.refresh();
    this.timer = window.setTimeout(() => this.open(), this.retry);
    this.retry = Math.min(this.retry * 2, 30000);
  }

  private close(): void {
    this.live = false;
    if (this.timer !== null) {
      window.clearTimeout(this.timer);
      this.timer = null;
    }
    if (this.source) {
      this.source.close();
      this.source = null;
    }
  }

  dispose(): void {
    this.disposed = true;
    this.close();
    this.poll.dispose();
    document.removeEventListener('visibilitychange', this.onVisibility);
  }
}
