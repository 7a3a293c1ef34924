export const VERSION = "0.1.0";
export const DEFAULT_SCOPE = "default";
