//go:build !linux

package ref

import "errors"

// requestTileData: only Linux is asked for the tile state here.
func requestTileData(bit uint) error {
	return errors.New("this OS is not asked for the tile state (only Linux's arch_prctl is)")
}
